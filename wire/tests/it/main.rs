//! proxy-wire's integration tests, one test binary: one module per reader (and the fuzz corpora).

mod client_hello;
mod fuzz_corpus;
mod http2;
mod http_head;
mod lines;
mod proxy_protocol;
mod reasons;
