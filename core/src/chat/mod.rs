//! Wire types of the Chat Completions API: the request we send ([`Request`]) and the answers
//! the upstream sends ([`answer`]).

pub mod answer;
pub mod request;

pub use answer::{
    parse, Choice, Chunk, ChunkChoice, Completion, CompletionTokensDetails, Delta, FunctionCall,
    Logprobs, Message, PromptTokensDetails, TokenLogprob, ToolCall, TopLogprob, Usage,
};
pub use request::{Request, StreamOptions};
