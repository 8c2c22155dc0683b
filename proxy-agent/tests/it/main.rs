//! proxy-agent's integration tests, one test binary: the apiserver proxy in process, nginx as its
//! PROXY-protocol peer, and the binary's command line.

mod apiserver_proxy;
mod cli;
mod common;
mod nginx;
