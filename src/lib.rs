pub mod chat;
pub mod client;
pub mod config;
pub mod exchange;
pub mod extproc;
pub mod openresponses;
pub mod sse;
pub mod translate;
