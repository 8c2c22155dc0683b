//! The agents' wing: everything about who an agent is and whether its session may live — the agents' listeners and their TLS, the admission pipeline (handshake, hello, identity, token review, filing in the registry), the refusals, the token's re-reviews, revoked certificates, and this replica's announcement.
//!
//! Open first: [`admit`] (an agent's way in, step by step). [`listener`] binds and reloads the
//! sockets; [`identity`] decides an agent's cluster by its cluster's rules; [`tokens`] reviews
//! ServiceAccount tokens; [`refusal`] says every refusal's label and what the agent is told;
//! [`rereview`] keeps a token session's token under review; [`revocation`] ends sessions a
//! reloaded revocation list names; [`replica`] is what this replica announces; [`wing`] holds
//! what only agents' sessions use. The registry files the sessions and knows nothing of this.

mod admit;
mod identity;
mod listener;
mod refusal;
mod replica;
mod rereview;
mod revocation;
mod tokens;
mod wing;

pub(crate) use listener::{Listeners, Opened};
pub(crate) use wing::Agents;
