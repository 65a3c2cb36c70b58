//! Wire types of the OpenResponses API: the response object, its items, the streaming
//! events and the error envelope. Requests are validated from JSON by
//! `translate::request`, which needs field paths for its errors more than it needs types.

pub mod code;
pub mod error;
pub mod events;
pub mod response;

pub use code::{Code, ErrorCode};
pub use error::{ApiError, ContextTokens, ErrorKind};
pub use events::{DeltaFrame, Event, EventWriter, Events, Part};
pub use response::*;
