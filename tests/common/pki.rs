//! Certificates for the TLS tests, made at test time with the `openssl` CLI in a temp dir.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::TempDir;

/// A throwaway PKI in a temp dir (removed on Drop):
///
/// * `ca.pem`: the CA trusted by both sides; `other-ca.pem`: an unrelated CA;
/// * `server.pem/.key`: a server (the processor, the OTLP collector), SAN `DNS:localhost, IP:127.0.0.1`, signed by `ca`;
/// * `wrong-name.pem/.key`: a processor certificate for `elsewhere.example`, signed by `ca`;
/// * `envoy-client.pem/.key`: a client certificate signed by `ca` (Envoy's to the processor in
///   `e2e_security`, the processor's to the OTLP collector in `e2e_tracing`);
/// * `rogue-client.pem/.key`: a client certificate signed by `other-ca`.
pub struct Pki {
    dir: TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = TempDir::new("pki");
        let pki = Pki { dir };
        pki.openssl_available();
        pki.make_ca("ca");
        pki.make_ca("other-ca");
        pki.make_leaf(
            "server",
            "ca",
            "localhost",
            2,
            "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
        );
        pki.make_leaf(
            "wrong-name",
            "ca",
            "elsewhere.example",
            3,
            "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:elsewhere.example\n",
        );
        pki.make_leaf(
            "envoy-client",
            "ca",
            "envoy",
            4,
            "extendedKeyUsage=clientAuth\n",
        );
        pki.make_leaf(
            "rogue-client",
            "other-ca",
            "envoy",
            5,
            "extendedKeyUsage=clientAuth\n",
        );
        pki
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `path` as a `&str` argument.
    pub fn arg(&self, file: &str) -> String {
        self.path(file)
            .to_str()
            .expect("UTF-8 temp path")
            .to_owned()
    }

    fn openssl_available(&self) {
        let ok = Command::new("openssl")
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok,
            "these tests make their certificates with the `openssl` CLI, which is not \
             installed (e.g. `apt-get install openssl`)"
        );
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn make_key(&self, name: &str) {
        self.openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &format!("{name}.key"),
        ]);
    }

    fn make_ca(&self, name: &str) {
        self.make_key(name);
        self.openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=responses-extproc test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    fn make_leaf(&self, name: &str, ca: &str, cn: &str, serial: u32, extensions: &str) {
        self.make_key(name);
        self.openssl(&[
            "req",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ]);
        let ext = format!("{name}.ext");
        std::fs::write(
            self.path(&ext),
            format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                 {extensions}"
            ),
        )
        .expect("write extensions file");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-set_serial",
            &serial.to_string(),
            "-days",
            "2",
            "-out",
            &format!("{name}.pem"),
            "-extfile",
            &ext,
        ]);
    }
}
