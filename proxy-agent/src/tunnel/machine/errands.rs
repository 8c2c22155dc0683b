//! The slot's errands, as transitions of its machine: re-homing after a move notice or when the live session's name resolves elsewhere, replacing a draining replica, moving `auto` from h2 to QUIC — each dialled beside the live session, judged, then swapped in make-before-break or given up.

use super::*;

/// Errands: re-homing, replacing a draining replica, moving to QUIC.
impl Cx {
    pub(super) fn resolved(
        &mut self,
        now: Instant,
        phase: Phase,
        query: QueryId,
        addrs: Option<Vec<SocketAddr>>,
    ) -> Phase {
        let Phase::Connected(mut c) = phase else { return phase };
        match c.errand.take() {
            Some(Errand::Resolving { query: q, why: Why::Move(notice) }) if q == query => {
                self.move_resolved(&mut c, notice, addrs)
            }
            Some(Errand::Resolving { query: q, why: Why::Follow }) if q == query => {
                self.follow_resolved(now, &mut c, addrs)
            }
            errand => c.errand = errand,
        }
        Phase::Connected(c)
    }

    pub(super) fn move_resolved(&mut self, c: &mut Connected, notice: Notice, addrs: Option<Vec<SocketAddr>>) {
        let (server, to) = (&self.slot.label, &notice.next);
        // A notice that reaches us after we already moved there (e.g. DNS got us there first,
        // and the old session delivered the notice late) changes nothing.
        if addrs.is_some_and(|a| a.contains(&c.live.peer)) {
            tracing::info!(%server, %to, "move notice: already connected there");
            return;
        }
        tracing::info!(%server, from = %c.live.target, %to, "move notice: re-homing");
        let over = Over::configured(self.settings.transport);
        self.start(c, Purpose::Rehome { drain: notice.drain }, notice.next, over);
    }

    pub(super) fn follow_resolved(&mut self, now: Instant, c: &mut Connected, addrs: Option<Vec<SocketAddr>>) {
        c.follow_at = Some(now + self.settings.reresolve);
        let (name, old) = (c.live.target.clone(), c.live.peer);
        // Follow DNS: the name we dialled no longer includes the address we are on.
        if let Some(new) = addrs.filter(|a| !a.is_empty() && !a.contains(&old)) {
            tracing::info!(server = %self.slot.label, %name, %old, ?new, "server name resolves elsewhere: re-homing");
            self.slot.metrics.moved();
            let purpose = Purpose::Rehome { drain: Some(self.settings.rehome_drain) };
            self.start(c, purpose, name, Over::configured(self.settings.transport));
        }
    }

    pub(super) fn candidate_dialed(
        &mut self,
        now: Instant,
        mut c: Box<Connected>,
        purpose: Purpose,
        d: Dial,
        result: Result<SocketAddr, EstablishError>,
    ) -> Phase {
        match result {
            Ok(peer) => {
                self.fell_back(&d);
                let deadline = now + self.settings.dial_timeout;
                c.errand = Some(Errand::Trying { purpose, session: Self::session(d, peer, now), deadline });
                Phase::Connected(c)
            }
            Err(e) => match self.fallback(&d, &e) {
                Some(dial) => {
                    c.errand = Some(Errand::Dialing { purpose, dial });
                    Phase::Connected(c)
                }
                None => self.not_kept(now, c, purpose, &d.target, &e.to_string()),
            },
        }
    }

    /// The candidate's deadline passed without a verdict.
    pub(super) fn deadline(&mut self, now: Instant, mut c: Box<Connected>) -> Phase {
        match c.errand.take() {
            Some(Errand::Trying { purpose, session, deadline }) if deadline <= now => {
                // A server that announces nothing (an older version) is taken once it is up
                // (a move target would have been taken when it came up).
                let good = session.up;
                self.judged(now, c, purpose, session, good)
            }
            errand => {
                c.errand = errand;
                Phase::Connected(c)
            }
        }
    }

    pub(super) fn judged(
        &mut self,
        now: Instant,
        c: Box<Connected>,
        purpose: Purpose,
        session: Session,
        good: bool,
    ) -> Phase {
        if good {
            return self.swap(now, c, purpose, session);
        }
        let id = session.info.as_ref().map(|i| i.id.as_str());
        tracing::debug!(server = %self.slot.label, ?id, "candidate session reached a replica already held or draining, or did not come up");
        // No deadline: the seed may already have opened a stream on it (a fresh session is
        // the least busy one); GOAWAY stops new ones, and the session closes when those end.
        self.retire(session.id, None, "replacement candidate not kept; closing it");
        let why =
            if session.up { "it reached a replica already held or draining" } else { "it did not come up in time" };
        match self.not_kept(now, c, purpose, &session.target, why) {
            // The path answers, but behind the name is a replica another slot holds: the next
            // rescue waits for the probe back-off, so that the other replicas are not handed a
            // session every pace while this one's path stays silent.
            Phase::Connected(mut c) if matches!(purpose, Purpose::Rescue) && session.up && c.rescue_at.is_some() => {
                c.rescue_at = Some(now + self.probe_wait().max(RESCUE_PACE));
                Phase::Connected(c)
            }
            phase => phase,
        }
    }

    /// The errand's session did not make it: the live session stays.
    pub(super) fn not_kept(
        &mut self,
        now: Instant,
        mut c: Box<Connected>,
        purpose: Purpose,
        target: &HostPort,
        why: &str,
    ) -> Phase {
        let server = &self.slot.label;
        match purpose {
            Purpose::Rehome { .. } => {
                tracing::warn!(%server, %target, error = %why, "cannot reach the new server; staying on the current session")
            }
            Purpose::Replace => {
                tracing::debug!(%server, error = %why, "no replacement session yet; trying again later");
                if c.draining() {
                    c.replace_at = Some(now + self.probe_wait());
                }
            }
            Purpose::Upgrade => {
                tracing::debug!(%server, %target, error = %why, "transport auto: QUIC still does not get through; staying on h2")
            }
            Purpose::Rescue => {
                tracing::debug!(%server, %target, error = %why, "no replacement for the suspect session yet; trying again");
                if c.live.quiet {
                    let draw = (self.draw)().clamp(0.0, 1.0);
                    c.rescue_at = Some(now + RESCUE_PACE.mul_f64(0.5 + 0.5 * draw));
                }
            }
        }
        Phase::Connected(c)
    }

    /// Make-before-break: `session` is up (and judged good); it takes over, then the old live
    /// session is retired. After a re-homing the seed it leaves can still open streams on it
    /// until the drain deadline: that seed's kube-apiserver serves until the move completes
    /// (its clients' connections drain there), and its dials must not fail meanwhile. Fencing
    /// the cluster there ends the session earlier.
    pub(super) fn swap(&mut self, now: Instant, c: Box<Connected>, purpose: Purpose, session: Session) -> Phase {
        let (drain, why) = self.arrive(purpose, &session.target);
        let open = matches!(purpose, Purpose::Rehome { .. });
        self.out.push(Action::Retire { id: c.live.id, drain, open, why });
        self.adopt(now, session)
    }

    /// The errand's session takes the slot's place: the slot is where it went now. Returns the
    /// old session's drain deadline and the reason logged when it is retired.
    pub(super) fn arrive(&mut self, purpose: Purpose, target: &HostPort) -> (Option<Duration>, &'static str) {
        self.target = target.clone();
        match purpose {
            Purpose::Rehome { drain } => (drain, "tunnel session replaced; draining the old one"),
            Purpose::Replace => {
                self.probe.reset();
                // The draining replica ends the old session's streams at its own deadline.
                (None, "replica draining: replaced; its streams finish there")
            }
            Purpose::Rescue => {
                self.slot.metrics.replaced();
                // Its streams wait for the path until they end or its keepalive gives up.
                (None, "tunnel session suspect: replaced; its open streams go on there")
            }
            Purpose::Upgrade => {
                self.slot.metrics.transport_change(Carrier::H2, Carrier::Quic);
                // Make-before-break, as for re-homing: GOAWAY on the h2 session, whose streams
                // run to their end.
                (
                    None,
                    "transport auto: QUIC gets through now; moved the session to QUIC, the h2 session's streams finish there",
                )
            }
        }
    }
}
