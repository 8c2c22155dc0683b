//! h2's errors and the agent's answers as the tunnel's: a failed connection as a session error, a failed open, a refused dial.

use crate::tunnel::session::{OpenError, SessionError};
use crate::tunnel::{DialError, ERROR_HEADER, REASON_HEADER};
use http::Response;

/// h2's error as the session's, saying what failed (`context`).
pub(super) fn failed(context: &'static str) -> impl FnOnce(h2::Error) -> SessionError {
    move |e| SessionError::transport(context, e)
}

/// A failed open: a GOAWAY from the agent means it drains (503, and the dial may be retried on
/// another agent), anything else is a transport failure.
pub(super) fn open_error(e: h2::Error) -> OpenError {
    if e.is_go_away() && e.is_remote() {
        OpenError::GoingAway(format!("the agent is shutting down ({e})"))
    } else {
        DialError::Transport(e.to_string()).into()
    }
}

pub(super) fn dial_error_from_response(resp: &Response<h2::RecvStream>) -> DialError {
    let h = |name| resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let code = h(ERROR_HEADER);
    if code.is_empty() {
        DialError::Transport(format!("agent answered {}", resp.status()))
    } else {
        DialError::from_code(&code, h(REASON_HEADER))
    }
}
