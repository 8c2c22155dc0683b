//! Live TLS front-end connections by client certificate: those that a reloaded revocation list names end within seconds of the change, logged with the serial, with `certificate_revoked` as their access event's reason.
//!
//! rustls refuses a revoked certificate at the handshake; a connection verified before the
//! list named it is found here. A TLS front end's material reloads itself when its `tls.crl`
//! changes (within [`proxy_core::watch::Poll::TLS`]) and [`Live::follow`] then takes the lists its
//! verifier checks (matched to the CAs by key, [`proxy_core::tls::Revoked`]). Every connection
//! of that front end whose certificate they revoke is ended: its stream ([`Revocable`]) fails
//! every read and write from then on, so whatever serves it (the CONNECT relay, the
//! forward-proxy or gRPC server) ends as it would on a broken client; a connection registered
//! after a change is checked against the lists in force at once. The CONNECT relay and the
//! forward-proxy server see the error ([`ended_by`]); the gRPC server loses it in the streams it
//! resets, so its connection's stream notes it ([`Noted`]) for them.

use proxy_core::sync::Mutex;
use proxy_core::tls::Revoked;
use proxy_core::watch::tls::Reloading;
use rustls::pki_types::CertificateDer;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// A front-end connection's stream, as the front ends serve it.
type BoxIo = Box<dyn proxy_core::relay::io::Resettable>;

/// The reason of the access event (and of `seedgate_connections_total{result}`) of a
/// connection ended because its client certificate was revoked.
pub(crate) const REASON: &str = "certificate_revoked";

/// The error every read and write of a revoked connection fails with.
#[derive(Debug, thiserror::Error)]
#[error("the client certificate is revoked")]
pub(crate) struct CertificateRevoked;

/// Whether `e` (or an error it wraps: hyper's, an I/O error) is a revoked connection's.
pub(crate) fn ended_by(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    // Bounded: error chains are short.
    for _ in 0..16 {
        let Some(e) = cur else { return false };
        if e.is::<CertificateRevoked>() {
            return true;
        }
        let wrapped = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref());
        cur = wrapped.map(|w| w as &(dyn std::error::Error + 'static)).or_else(|| e.source());
    }
    false
}

/// The live TLS front-end connections with a client certificate, and the lists in force for
/// each front end.
#[derive(Clone, Default)]
pub(crate) struct Live {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    next: u64,
    conns: HashMap<u64, Conn>,
    /// By front end: the lists its verifier checks now.
    lists: HashMap<Arc<str>, Arc<Revoked>>,
}

struct Conn {
    frontend: Arc<str>,
    peer: String,
    cert: CertificateDer<'static>,
    end: CancellationToken,
}

impl State {
    /// End every connection of `frontend` whose certificate the lists in force revoke.
    fn end_revoked(&mut self, frontend: &str) {
        let Some(lists) = self.lists.get(frontend).filter(|l| !l.is_empty()) else { return };
        let revoked: Vec<(u64, String)> = self
            .conns
            .iter()
            .filter(|(_, c)| &*c.frontend == frontend)
            .filter_map(|(id, c)| Some((*id, lists.of(&c.cert)?)))
            .collect();
        for (id, serial) in revoked {
            if let Some(c) = self.conns.remove(&id) {
                c.ended(&serial);
            }
        }
    }
}

impl Conn {
    fn ended(&self, serial: &str) {
        tracing::warn!(frontend = %self.frontend, client = %self.peer, %serial, "front-end connection ended: its client certificate is revoked");
        self.end.cancel();
    }
}

impl Live {
    /// `io`, ended when a list in force for `frontend` revokes its client certificate (at once
    /// if one does now). A connection without a certificate is returned as it is.
    pub(crate) fn watch(&self, frontend: &Arc<str>, peer: &str, io: TlsStream<TcpStream>) -> BoxIo {
        let Some(cert) = io.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| c.clone().into_owned())
        else {
            return Box::new(io);
        };
        let end = CancellationToken::new();
        let conn = Conn { frontend: frontend.clone(), peer: peer.to_owned(), cert, end: end.clone() };
        let id = {
            let mut s = self.state.lock();
            // The lists may have changed while this client's handshake was verified.
            match s.lists.get(frontend).and_then(|l| l.of(&conn.cert)) {
                Some(serial) => {
                    conn.ended(&serial);
                    None
                }
                None => {
                    s.next += 1;
                    let id = s.next;
                    s.conns.insert(id, conn);
                    Some(id)
                }
            }
        };
        let registered = Registered { state: self.state.clone(), id };
        Box::new(Revocable { io, ended: Box::pin(end.cancelled_owned()), revoked: false, _registered: registered })
    }

    /// Until `stop`: after every reload of `material` (a front end's), take the lists its
    /// verifier checks and end the connections of `frontend` they revoke. The lists in force
    /// now are taken before this returns, so no connection accepted after it goes unchecked.
    pub(crate) fn follow(
        &self,
        frontend: &str,
        material: &Arc<Reloading<rustls::ServerConfig>>,
        stop: CancellationToken,
    ) {
        let frontend: Arc<str> = Arc::from(frontend);
        let mut changes = material.subscribe();
        self.take(&frontend, material.revoked());
        let (this, material) = (self.clone(), material.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = changes.changed() => if r.is_err() { return },
                }
                this.take(&frontend, material.revoked());
            }
        });
    }

    /// `lists` are in force for `frontend` from now: end the connections they revoke.
    fn take(&self, frontend: &Arc<str>, lists: Arc<Revoked>) {
        let mut s = self.state.lock();
        s.lists.insert(frontend.clone(), lists);
        s.end_revoked(frontend);
    }
}

/// A connection's place in [`Live`], given up with its stream.
struct Registered {
    state: Arc<Mutex<State>>,
    /// `None`: ended at registration.
    id: Option<u64>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.state.lock().conns.remove(&id);
        }
    }
}

/// A front-end connection's stream that fails every read and write with [`CertificateRevoked`]
/// once its certificate is revoked. Its relay (or server) polls it whenever it waits on the
/// client, which wakes it when the revocation comes; a relay that waits on its tunnel stream
/// both ways (a stalled stream) meets the error at its next read or write of the client.
pub(crate) struct Revocable<S> {
    io: S,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
    revoked: bool,
    _registered: Registered,
}

impl<S> Revocable<S> {
    /// `Err` once the certificate is revoked; registers the caller's waker until then.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.revoked && self.ended.as_mut().poll(cx).is_ready() {
            self.revoked = true;
        }
        match self.revoked {
            true => Err(io::Error::new(io::ErrorKind::PermissionDenied, CertificateRevoked)),
            false => Ok(()),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Revocable<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Revocable<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<S: proxy_core::relay::io::Resettable> proxy_core::relay::io::Resettable for Revocable<S> {
    fn reset(&mut self) {
        self.io.reset();
    }
}

/// A connection's stream that notes when one of its reads or writes failed because its client
/// certificate was revoked ([`ended_by`]): what serves it over HTTP/2 loses that error in the
/// streams it resets, and asks [`Noted::revoked`] instead.
pub(crate) struct Noted<S> {
    io: S,
    revoked: Arc<AtomicBool>,
}

/// Whether a [`Noted`] stream failed because its client certificate was revoked.
#[derive(Clone, Default)]
pub(crate) struct RevokedNote(Arc<AtomicBool>);

impl RevokedNote {
    pub(crate) fn revoked(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl<S> Noted<S> {
    /// `io`, and the note its failures leave.
    pub(crate) fn new(io: S) -> (Self, RevokedNote) {
        let note = RevokedNote::default();
        (Self { io, revoked: note.0.clone() }, note)
    }

    fn note<T>(&self, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(e)) = &r
            && ended_by(e)
        {
            self.revoked.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Noted<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        this.note(r)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Noted<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.note(r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.note(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.note(r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.note(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_stream_is_known_through_the_errors_that_wrap_it() {
        let io = io::Error::new(io::ErrorKind::PermissionDenied, CertificateRevoked);
        assert!(ended_by(&io));
        #[derive(Debug, thiserror::Error)]
        #[error("connection error")]
        struct Wrapper(#[source] io::Error);
        assert!(ended_by(&Wrapper(io)));
        assert!(!ended_by(&io::Error::new(io::ErrorKind::PermissionDenied, "other")));
        assert!(!ended_by(&Wrapper(io::Error::other("reset"))));
    }

    /// A stream whose reads or writes fail for its revoked certificate leaves the note; other
    /// failures do not.
    #[tokio::test]
    async fn a_noted_stream_notes_a_revocation_and_nothing_else() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut other, note) = Noted::new(failing(io::Error::other("reset")));
        assert!(other.read(&mut [0u8; 4]).await.is_err() && other.write(b"x").await.is_err());
        assert!(!note.revoked(), "another failure is not a revocation");
        let (mut revoked, note) =
            Noted::new(failing(io::Error::new(io::ErrorKind::PermissionDenied, CertificateRevoked)));
        assert!(revoked.write(b"x").await.is_err());
        assert!(note.revoked(), "a revoked certificate's failure is noted");
    }

    /// A stream whose every read and write fails as `e` does (its kind, and whether it is a
    /// revoked certificate's).
    fn failing(e: io::Error) -> impl AsyncRead + AsyncWrite + Unpin {
        struct Failing(io::ErrorKind, bool);
        impl Failing {
            fn error(&self) -> io::Error {
                match self.1 {
                    true => io::Error::new(self.0, CertificateRevoked),
                    false => io::Error::new(self.0, "failing"),
                }
            }
        }
        impl AsyncRead for Failing {
            fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Err(self.error()))
            }
        }
        impl AsyncWrite for Failing {
            fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
                Poll::Ready(Err(self.error()))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Err(self.error()))
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Err(self.error()))
            }
        }
        Failing(e.kind(), ended_by(&e))
    }
}
