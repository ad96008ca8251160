//! Sessions: who is on the other end of each connection (its `Hello`:
//! protocol version, volume, client id), and what goes when a connection
//! does (its waiting acquires).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use morris_proto::net::Conn;
use morris_proto::{ErrorCode, Reply, WireError, PROTOCOL_VERSION};
use tracing::info;

use super::{err, Server};
use crate::leases::{ClientId, Effects, Ticket};

/// Who is on the other end of a connection, after its `Hello`.
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub(super) client_id: ClientId,
    pub(super) name: String,
    /// `Hello` named no volume: may not take leases.
    pub(super) admin: bool,
}

#[derive(Default)]
pub(super) struct Sessions {
    pub(super) by_conn: HashMap<u64, (Session, Weak<Conn>)>,
    /// Live connections of each (non-admin) client, for pushes.
    pub(super) by_client: HashMap<ClientId, Vec<(u64, Weak<Conn>)>>,
}

impl Server {
    pub(super) fn hello(
        &self,
        conn: &Arc<Conn>,
        volume: Option<uuid::Uuid>,
        client_id: ClientId,
        client_name: String,
        version: u32,
    ) -> Result<Reply, WireError> {
        if version != PROTOCOL_VERSION {
            return Err(err(
                ErrorCode::Protocol,
                format!(
                    "protocol version {version} is not supported (this server speaks {PROTOCOL_VERSION})"
                ),
            ));
        }
        let formatted = self.store.formatted();
        if let Some(want) = volume {
            match &formatted {
                None => {
                    return Err(err(
                        ErrorCode::WrongVolume,
                        format!("server is not formatted; client expects volume {want}"),
                    ))
                }
                Some(f) if f.descriptor.uuid != want => {
                    return Err(err(
                        ErrorCode::WrongVolume,
                        format!(
                            "server belongs to volume {}, client expects volume {want}",
                            f.descriptor.uuid
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        let session = Session {
            client_id,
            name: client_name.chars().take(256).collect(),
            admin: volume.is_none(),
        };
        info!(peer = %conn.peer, client = client_id, name = %session.name, admin = session.admin, "session opened");
        {
            let mut s = self.sessions.lock();
            if let Some((old, _)) = s.by_conn.remove(&conn.id) {
                remove_client_conn(&mut s, old.client_id, conn.id);
            }
            if !session.admin {
                s.by_client
                    .entry(client_id)
                    .or_default()
                    .push((conn.id, Arc::downgrade(conn)));
            }
            s.by_conn.insert(conn.id, (session, Arc::downgrade(conn)));
        }
        if volume.is_some() {
            let now = self.now_ms();
            self.leases.lock().table.touch(client_id, now);
            self.seen.lock().insert(client_id, now);
        }
        Ok(Reply::Hello {
            index: formatted.as_ref().map(|f| f.index),
            epoch: self.epoch(),
            descriptor: formatted.map(|f| f.descriptor.clone()),
            lease_ms: self.lease_ms,
        })
    }

    pub(super) fn disconnect(&self, conn: &Conn) {
        let removed = {
            let mut s = self.sessions.lock();
            let removed = s.by_conn.remove(&conn.id);
            if let Some((old, _)) = &removed {
                remove_client_conn(&mut s, old.client_id, conn.id);
            }
            removed
        };
        // Abandon this connection's waiting acquires: nobody can be told.
        let recalls = {
            let mut st = self.leases.lock();
            let mine: Vec<Ticket> = st
                .waiters
                .iter()
                .filter(|(_, (c, _))| *c == conn.id)
                .map(|(&t, _)| t)
                .collect();
            let mut fx = Effects::default();
            let now = self.now_ms();
            for t in mine {
                st.waiters.remove(&t);
                st.table.cancel(t, now, &mut fx);
            }
            Self::settle(&mut st, fx)
        };
        self.push_recalls(recalls);
        if let Some((s, _)) = removed {
            info!(peer = %conn.peer, client = s.client_id, name = %s.name, "session closed");
        }
    }
}

fn remove_client_conn(s: &mut Sessions, client: ClientId, conn_id: u64) {
    if let Some(v) = s.by_client.get_mut(&client) {
        v.retain(|(id, _)| *id != conn_id);
        if v.is_empty() {
            s.by_client.remove(&client);
        }
    }
}
