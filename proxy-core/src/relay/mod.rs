//! The byte relay between two streams: the copy, the streams it moves, its access event — and the one policy, for every binary and every kind of stream, on how both ends close.
//!
//! Every relay in seedgate (sni-router's connections, the agent's apiserver proxy and tunnel
//! streams, proxy-server's front ends) ends through [`run`], which closes both ends by this table:
//!
//! | how the relay ended ([`Outcome`]) | client end | upstream end | why |
//! |---|---|---|---|
//! | `Closed`: FIN both ways | — | — | each FIN was already passed on by the relay |
//! | `Reset(Client)` | — | reset | a reset on one side resets the other |
//! | `Reset(Upstream)` | reset | — | the same, the other way |
//! | `Error(Client, _)` | reset | reset | the transfer was cut: a FIN would make it look complete |
//! | `Error(Upstream, _)` | reset | reset | the same |
//! | `Idle`: the idle timeout | FIN | FIN | both peers are alive and quiet: an orderly end |
//! | `Stopped(_)`: a drain deadline or the end of the shutdown grace | FIN | FIN | the operator asked for it: an orderly end, never a reset |
//!
//! "Reset" is what the stream kind has for it: TCP RST (zero linger), RST_STREAM(CANCEL) on a
//! tunnel stream, a plain close on a Unix socket (which has no reset). "FIN" is the stream's
//! orderly write shutdown: TCP FIN, TLS close_notify then FIN, END_STREAM on a tunnel stream.

pub mod access;
pub mod buf;
pub mod copy;
pub mod io;
mod splice;

use crate::relay::copy::{Outcome, Pump, Side, Stop, Transfer};
use crate::relay::io::Resettable;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// What the policy does to one end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Nothing more: the end is already closed the right way.
    Nothing,
    /// An orderly end of stream.
    Fin,
    /// An abortive close.
    Reset,
}

/// The policy table: what to do to the (client, upstream) ends after `outcome`.
pub fn policy(outcome: &Outcome) -> (Close, Close) {
    use Close::*;
    match outcome {
        Outcome::Closed => (Nothing, Nothing),
        Outcome::Reset(Side::Client) => (Nothing, Reset),
        Outcome::Reset(Side::Upstream) => (Reset, Nothing),
        Outcome::Error(..) => (Reset, Reset),
        Outcome::Idle | Outcome::Stopped(_) => (Fin, Fin),
    }
}

/// Longest wait for an orderly write shutdown (a TLS close_notify behind a full send buffer);
/// after it the end is simply closed.
const FIN_TIMEOUT: Duration = Duration::from_secs(1);

async fn close_one<S: Resettable>(how: Close, s: &mut S) {
    match how {
        Close::Nothing => {}
        Close::Reset => s.reset(),
        Close::Fin => {
            let _ = tokio::time::timeout(FIN_TIMEOUT, s.shutdown()).await;
        }
    }
}

/// Close both ends of a finished relay as [`policy`] says.
pub async fn close_ends<C: Resettable, U: Resettable>(outcome: &Outcome, client: &mut C, upstream: &mut U) {
    let (c, u) = policy(outcome);
    close_one(c, client).await;
    close_one(u, upstream).await;
}

/// The stop of a relay whose connection `end` ends (a route's or a cluster's drain token, a
/// tunnel session's kill token, or the shutdown kill token itself): [`Stop::Shutdown`] once the
/// shutdown grace is over (`kill` cancelled), else `drained`. Pinned, it is the `stop` of [`run`].
pub async fn stop_on(end: &CancellationToken, kill: &CancellationToken, drained: Stop) -> Stop {
    end.cancelled().await;
    if kill.is_cancelled() { Stop::Shutdown } else { drained }
}

/// A finished relay: how it ended and the bytes each way.
#[derive(Debug)]
pub struct Finished {
    pub outcome: Outcome,
    pub bytes: crate::relay::access::Bytes,
}

/// Relay until the transfer ends or `stop` completes (a drain deadline, the end of the shutdown
/// grace), then close both ends by the policy.
///
/// Written out by hand rather than as an `async fn`: it sits inside every open connection's
/// future for the connection's whole life, and this keeps it at a few words (the transfer is
/// borrowed, `stop` is usually a pinned reference, the closing step is boxed when it starts).
pub fn run<'a, C, U, P, F>(transfer: &'a mut Transfer<C, U, P>, stop: F) -> Run<'a, C, U, P, F>
where
    F: Future<Output = Stop> + Unpin,
{
    Run { transfer: Some(transfer), stop, closing: None }
}

/// The future of [`run`].
pub struct Run<'a, C, U, P, F> {
    transfer: Option<&'a mut Transfer<C, U, P>>,
    stop: F,
    closing: Option<Pin<Box<dyn Future<Output = Finished> + Send + 'a>>>,
}

impl<'a, C, U, P, F> Future for Run<'a, C, U, P, F>
where
    C: Resettable + 'a,
    U: Resettable + 'a,
    P: Pump<C, U> + Pump<U, C> + Send + 'a,
    F: Future<Output = Stop> + Unpin,
{
    type Output = Finished;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finished> {
        let this = &mut *self;
        if let Some(closing) = &mut this.closing {
            return closing.as_mut().poll(cx);
        }
        let transfer = this.transfer.as_mut().expect("polled after completion");
        let outcome = match Pin::new(&mut **transfer).poll(cx) {
            Poll::Ready(o) => o,
            Poll::Pending => match Pin::new(&mut this.stop).poll(cx) {
                Poll::Ready(why) => Outcome::Stopped(why),
                Poll::Pending => return Poll::Pending,
            },
        };
        let transfer = this.transfer.take().expect("checked above");
        let mut closing = Box::pin(async move {
            let (to_upstream, to_client) = transfer.counts();
            let (client, upstream) = transfer.ends_mut();
            close_ends(&outcome, client, upstream).await;
            Finished { outcome, bytes: crate::relay::access::Bytes::new(to_upstream, to_client) }
        });
        let r = closing.as_mut().poll(cx);
        this.closing = Some(closing);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::copy::{Meters, transfer, transfer_tcp};
    use std::io;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    #[test]
    fn every_row_of_the_table() {
        use Close::*;
        let err = || io::Error::other("x");
        let rows: [(Outcome, (Close, Close)); 9] = [
            (Outcome::Closed, (Nothing, Nothing)),
            (Outcome::Reset(Side::Client), (Nothing, Reset)),
            (Outcome::Reset(Side::Upstream), (Reset, Nothing)),
            (Outcome::Error(Side::Client, err()), (Reset, Reset)),
            (Outcome::Error(Side::Upstream, err()), (Reset, Reset)),
            (Outcome::Idle, (Fin, Fin)),
            (Outcome::Stopped(Stop::Shutdown), (Fin, Fin)),
            (Outcome::Stopped(Stop::RouteDrained), (Fin, Fin)),
            (Outcome::Stopped(Stop::ClusterDrained), (Fin, Fin)),
        ];
        for (o, want) in rows {
            assert_eq!(policy(&o), want, "{}", o.label());
        }
        assert_eq!(policy(&Outcome::Stopped(Stop::SessionDrained)), (Fin, Fin));
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// What the far end of `s` sees next: Ok(n) bytes, Ok(0) a FIN, Err(kind) a reset.
    async fn far_end_sees(s: &mut TcpStream) -> Result<usize, io::ErrorKind> {
        let mut b = [0u8; 16];
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .expect("far end saw nothing")
            .map_err(|e| e.kind())
    }

    /// client_far <-> [client  relay  upstream] <-> upstream_far, over real TCP sockets.
    async fn relay_world() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
        let (client_far, client) = pair().await;
        let (upstream, upstream_far) = pair().await;
        (client_far, client, upstream, upstream_far)
    }

    #[tokio::test]
    async fn a_client_reset_resets_the_upstream() {
        let (client_far, client, upstream, mut upstream_far) = relay_world().await;
        let t = transfer_tcp(client, upstream, Duration::from_secs(30), Meters::default());
        let relay = tokio::spawn(async move { run(&mut { t }, std::future::pending()).await });
        crate::net::reset_on_close(&client_far);
        drop(client_far);
        let f = relay.await.unwrap();
        assert_eq!(f.outcome.label(), "client_reset");
        assert_eq!(far_end_sees(&mut upstream_far).await, Err(io::ErrorKind::ConnectionReset));
    }

    #[tokio::test]
    async fn an_upstream_reset_resets_the_client() {
        let (mut client_far, client, upstream, upstream_far) = relay_world().await;
        let t = transfer(client, upstream, Duration::from_secs(30), Meters::default());
        let relay = tokio::spawn(async move { run(&mut { t }, std::future::pending()).await });
        crate::net::reset_on_close(&upstream_far);
        drop(upstream_far);
        assert_eq!(relay.await.unwrap().outcome.label(), "upstream_reset");
        assert_eq!(far_end_sees(&mut client_far).await, Err(io::ErrorKind::ConnectionReset));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_ends_with_a_fin_both_ways() {
        let (mut client_far, client, upstream, mut upstream_far) = relay_world().await;
        let t = transfer_tcp(client, upstream, Duration::from_secs(5), Meters::default());
        let f = run(&mut { t }, std::future::pending()).await;
        assert_eq!(f.outcome.label(), "idle_timeout");
        assert_eq!(far_end_sees(&mut client_far).await, Ok(0));
        assert_eq!(far_end_sees(&mut upstream_far).await, Ok(0));
    }

    #[tokio::test]
    async fn a_stop_ends_with_a_fin_both_ways_and_counts_the_bytes() {
        use tokio::io::AsyncWriteExt;
        let (mut client_far, client, upstream, mut upstream_far) = relay_world().await;
        let t = transfer(client, upstream, Duration::from_secs(30), Meters::default());
        let (end, kill) = (CancellationToken::new(), CancellationToken::new());
        let route_end = end.clone();
        let relay = tokio::spawn(async move {
            let stop = std::pin::pin!(stop_on(&route_end, &kill, Stop::RouteDrained));
            run(&mut { t }, stop).await
        });
        client_far.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        upstream_far.read_exact(&mut b).await.unwrap();
        end.cancel();
        let f = relay.await.unwrap();
        assert_eq!((f.outcome.label(), f.bytes.to_upstream, f.bytes.to_client), ("route_drained", 5, 0));
        assert_eq!(far_end_sees(&mut client_far).await, Ok(0));
        assert_eq!(far_end_sees(&mut upstream_far).await, Ok(0));
    }

    #[tokio::test]
    async fn a_stop_is_a_shutdown_once_the_grace_is_over_and_the_drain_otherwise() {
        let (end, kill) = (CancellationToken::new(), CancellationToken::new());
        end.cancel();
        assert_eq!(stop_on(&end, &kill, Stop::ClusterDrained).await, Stop::ClusterDrained);
        let end = kill.child_token();
        kill.cancel();
        assert_eq!(stop_on(&end, &kill, Stop::SessionDrained).await, Stop::Shutdown);
        assert_eq!(stop_on(&kill, &kill, Stop::Shutdown).await, Stop::Shutdown);
    }

    #[tokio::test]
    async fn an_error_resets_both_ends() {
        let (mut client_far, mut client, mut upstream, mut upstream_far) = relay_world().await;
        close_ends(&Outcome::Error(Side::Upstream, io::Error::other("broken")), &mut client, &mut upstream).await;
        drop((client, upstream));
        assert_eq!(far_end_sees(&mut client_far).await, Err(io::ErrorKind::ConnectionReset));
        assert_eq!(far_end_sees(&mut upstream_far).await, Err(io::ErrorKind::ConnectionReset));
    }

    #[tokio::test]
    async fn a_unix_socket_end_is_closed_where_it_cannot_be_reset() {
        let (mut far, mut near) = tokio::net::UnixStream::pair().unwrap();
        let (mut tcp_far, mut tcp) = pair().await;
        close_ends(&Outcome::Error(Side::Client, io::Error::other("cut")), &mut near, &mut tcp).await;
        drop((near, tcp));
        let mut b = [0u8; 1];
        assert_eq!(far.read(&mut b).await.unwrap(), 0, "closed");
        assert_eq!(far_end_sees(&mut tcp_far).await, Err(io::ErrorKind::ConnectionReset));
    }
}
