//! An exchange's automatic compaction (`context_management`): its summarising call, the
//! call's answer read, the summary sealed and the turn translated again on the compacted
//! window.

use super::*;

use bytes::{Bytes, BytesMut};

use crate::openresponses::{ApiError, ErrorCode, Usage};
use crate::translate::request::Window;
use crate::translate::{self, compact, Meta};
use crate::upstream_failure::{self, CallFailure};

/// How an automatic compaction went, for logs, metrics and Envoy's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionOutcome {
    /// Its summarising call is in flight.
    Running,
    /// The summary is sealed and the turn went upstream on the compacted window.
    Compacted,
    /// The summarising call failed (the exchange ended with its error).
    Failed,
}

impl CompactionOutcome {
    /// Its name in metadata and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionOutcome::Running => "running",
            CompactionOutcome::Compacted => "compacted",
            CompactionOutcome::Failed => "failed",
        }
    }

    /// Its label once the exchange is recorded: `cut` for one still running, which the host
    /// ended first.
    pub fn recorded(self) -> &'static str {
        match self {
            CompactionOutcome::Running => "cut",
            other => other.as_str(),
        }
    }
}

/// An exchange's automatic compaction (`context_management`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub outcome: CompactionOutcome,
    /// The turn's estimated input tokens, which crossed `threshold`.
    pub estimate: u64,
    pub threshold: u64,
    /// The summarising request's usage, when the upstream reported it.
    pub usage: Option<Usage>,
}

/// An automatic compaction's call, in flight.
#[derive(Debug)]
pub(super) struct Compacting {
    /// The client's body, plain: the turn is translated again from it once the summary is
    /// sealed.
    request: Bytes,
    /// `request` is the client's body as it came (within the size cap), not one written from
    /// a parsed object.
    capped: bool,
    meta: Meta,
    /// What the turn echoes as `previous_response_id` ([`Exchange::request_read`]).
    continues: Option<String>,
    /// The call's answer, once its head came.
    answer: Option<CallAnswer>,
}

#[derive(Debug)]
struct CallAnswer {
    status: u16,
    /// JSON, or no content type (as for a forwarded request's answer).
    json: bool,
    body: BytesMut,
}

impl Exchange {
    /// The turn's estimate crossed its `compact_threshold`: its summarising request is the
    /// call to make first, and the turn waits in [`State::Compacting`].
    pub(super) fn compact(
        &mut self,
        request: Bytes,
        capped: bool,
        continues: Option<String>,
        meta: Meta,
        turn: translate::request::Translated,
        summarising: Result<translate::request::Translated, ApiError>,
    ) -> RequestStep {
        let summarising = match summarising {
            Ok(s) => s,
            Err(err) => return RequestStep::Reply(self.fail(err)),
        };
        let plan = &turn.plan;
        self.summary.response_id = Some(plan.id().to_owned());
        self.summary.model = Some(plan.model().to_owned());
        self.summary.stream = plan.is_stream();
        self.summary.params = plan.params();
        let due = turn.compaction_due.unwrap_or(translate::request::Due {
            estimate: 0,
            threshold: 0,
        });
        self.summary.compaction = Some(Compaction {
            outcome: CompactionOutcome::Running,
            estimate: due.estimate,
            threshold: due.threshold,
            usage: None,
        });
        let model = plan.model().to_owned();
        let up = UpstreamRequest {
            body: summarising.body,
            chat_model: summarising.chat_model.unwrap_or_else(|| model.clone()),
            model,
            stream: false,
        };
        self.state = State::Compacting(Box::new(Compacting {
            request,
            capped,
            meta,
            continues,
            answer: None,
        }));
        RequestStep::Call(up)
    }

    /// The head of the answer to [`RequestStep::Call`]'s call (`status`, `content_type`; an
    /// error made of it keeps the headers [`Exchange::upstream_headers`] was given).
    pub fn call_head(&mut self, status: u16, content_type: &str) -> RequestStep {
        let State::Compacting(c) = &mut self.state else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        if c.answer.is_some() {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        }
        let content_type = content_type.trim_start();
        c.answer = Some(CallAnswer {
            status,
            json: starts_with_ignore_case(content_type, JSON) || content_type.is_empty(),
            body: BytesMut::new(),
        });
        RequestStep::Hold
    }

    /// A piece of the call's answer body; `end` with the last: then the turn goes upstream
    /// ([`RequestStep::Forward`]), or the exchange ends with the call's error.
    pub fn call_body(&mut self, chunk: &[u8], end: bool, now: u64) -> RequestStep {
        let max = self.settings.max_body_bytes;
        let State::Compacting(c) = &mut self.state else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        let Some(answer) = &mut c.answer else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        if answer.body.len() + chunk.len() > max {
            let err = ApiError::server(
                502,
                ErrorCode::UpstreamResponseTooLarge,
                format!("the upstream's answer to the summarising request is larger than this server reads (--max-body-bytes, {max} bytes)."),
            );
            return RequestStep::Reply(self.compaction_failed(err));
        }
        answer.body.extend_from_slice(chunk);
        if !end {
            return RequestStep::Hold;
        }
        let State::Compacting(c) = std::mem::replace(&mut self.state, State::Done) else {
            unreachable!("matched above")
        };
        self.compacted(*c, now)
    }

    /// The call brought no whole answer: no answer, not all of it, or none before its
    /// deadline (`compaction_timeout`).
    pub fn call_failed(&mut self, why: CallFailure<'_>) -> RequestStep {
        if !matches!(self.state, State::Compacting(_)) {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        }
        let err = match why {
            CallFailure::TimedOut => ApiError::server(
                504,
                ErrorCode::UpstreamTimeout,
                format!(
                    "the summarising request took longer than this server waits (compaction_timeout, {} s).",
                    self.settings.compaction_timeout.as_secs()
                ),
            ),
            why => ApiError::server(
                503,
                ErrorCode::UpstreamUnavailable,
                format!("the summarising request failed: {}", why.message()),
            ),
        };
        RequestStep::Reply(self.compaction_failed(err))
    }

    /// The call's whole answer: its summary sealed, the turn translated again on the compacted
    /// window; or the exchange's error.
    fn compacted(&mut self, c: Compacting, _now: u64) -> RequestStep {
        let Some(answer) = c.answer else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        if !(200..300).contains(&answer.status) {
            let err = upstream_failure::classify(answer.status, &answer.body);
            let mut reply = self.compaction_failed(err);
            reply.headers = std::mem::take(&mut self.upstream_headers);
            return RequestStep::Reply(reply);
        }
        if !answer.json {
            let err = ApiError::server(
                502,
                ErrorCode::UpstreamInvalidResponse,
                "the upstream's answer to the summarising request is not JSON.",
            );
            return RequestStep::Reply(self.compaction_failed(err));
        }
        let summarised = match compact::summarised(&answer.body) {
            Ok(s) => s,
            Err(err) => return RequestStep::Reply(self.compaction_failed(err)),
        };
        let options = self.options();
        let options = options.as_ref();
        let Some(item) = compact::seal_lead(options, c.meta, &summarised.summary) else {
            let err = ApiError::server(
                500,
                ErrorCode::InternalError,
                "The exchange could not be completed: no keys to seal the compaction.",
            );
            return RequestStep::Reply(self.compaction_failed(err));
        };
        let blob = item.encrypted_content.clone();
        let turn = translate::request::translate_window(
            &c.request,
            c.capped,
            options,
            c.meta,
            Window::Compacted(blob),
        );
        if let Some(report) = &mut self.summary.compaction {
            report.outcome = CompactionOutcome::Compacted;
            report.usage = summarised.usage;
        }
        self.forward(turn.map(|mut t| {
            t.plan.set_lead(item, summarised.usage);
            t.plan.echo.previous_response_id = c.continues;
            t
        }))
    }

    /// The compaction failed: the exchange ends with `err`, its message naming the step.
    fn compaction_failed(&mut self, mut err: ApiError) -> ErrorReply {
        if let Some(report) = &mut self.summary.compaction {
            report.outcome = CompactionOutcome::Failed;
        }
        err.message = format!(
            "Compacting the input before this turn (context_management) failed: {}",
            err.message
        );
        self.fail(err)
    }
}
