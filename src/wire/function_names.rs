//! The names of the library's Redis Functions, and the removal of older releases' ones.
//!
//! A function library stays with the server's data (snapshots, the append-only file,
//! replicas) until deleted, where a script leaves the cache with a restart: each release of
//! this crate loads its own libraries, named by the release and the script's source
//! (`tower_redis_lock_<major>_<minor>_<patch>_<script>_<sha>`), so releases running side by
//! side (a rolling deploy) each call their own. When a client loads one, it deletes those of
//! strictly older releases: an instance of an older release still running finds its own gone
//! ("function not found") and loads it again, and never deletes a newer release's, so the two
//! settle after one load each, and a server keeps the libraries of the releases in use.

use std::collections::BTreeSet;

use redis::Value;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};

use crate::wire::conn::Conn;

/// The start of every library's name.
const PREFIX: &str = "tower_redis_lock_";

/// This release, as it stands in the names.
fn this_release() -> [u64; 3] {
    [
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_PATCH"),
    ]
    .map(|part| part.parse().expect("a version number"))
}

/// The name of the library (and of its one function) of the script `file` whose source's SHA
/// is `sha`.
pub(crate) fn library_name(file: &str, sha: &str) -> String {
    let [major, minor, patch] = this_release();
    let script = file.trim_end_matches(".lua");
    format!("{PREFIX}{major}_{minor}_{patch}_{script}_{}", &sha[..16])
}

/// The release a library of this crate was named by, if `name` is one.
fn release_of(name: &str) -> Option<[u64; 3]> {
    let mut parts = name.strip_prefix(PREFIX)?.splitn(4, '_');
    let mut release = [0; 3];
    for part in &mut release {
        *part = parts.next()?.parse().ok()?;
    }
    Some(release)
}

/// The names of the libraries `listed` (a `FUNCTION LIST` reply) holds.
fn names_listed(listed: &Value) -> Vec<String> {
    let Value::Array(libraries) = listed else {
        return Vec::new();
    };
    libraries
        .iter()
        .filter_map(|library| match library {
            // RESP2: a flat list of field names and values.
            Value::Array(fields) => fields.chunks(2).find_map(|pair| match pair {
                [Value::BulkString(field), Value::BulkString(name)]
                    if field.as_slice() == b"library_name" =>
                {
                    Some(String::from_utf8_lossy(name).into_owned())
                }
                _ => None,
            }),
            // RESP3: a map.
            Value::Map(fields) => fields.iter().find_map(|pair| match pair {
                (Value::BulkString(field), Value::BulkString(name))
                    if field.as_slice() == b"library_name" =>
                {
                    Some(String::from_utf8_lossy(name).into_owned())
                }
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

/// Deletes the libraries of this crate's releases older than this one on `conn`'s server,
/// or on every master of its cluster. Best effort: a user without `FUNCTION LIST` or
/// `FUNCTION DELETE` leaves them, and so does a master that was down.
pub(crate) async fn remove_older_releases(conn: &mut Conn) {
    let listed = match listed(conn).await {
        Ok(listed) => listed,
        Err(err) => {
            tracing::debug!(error = %err, "older releases' functions not listed");
            return;
        }
    };
    let ours = this_release();
    for name in listed {
        if release_of(&name).is_some_and(|release| release < ours) {
            let mut delete = redis::cmd("FUNCTION");
            // On a cluster redis-rs sends it to every master.
            delete.arg("DELETE").arg(&name);
            if let Err(err) = conn.query::<Value>(&delete).await {
                tracing::debug!(error = %err, library = name, "an older release's functions stay");
            }
        }
    }
}

/// The names of this crate's libraries on the server, or on any master of the cluster.
async fn listed(conn: &mut Conn) -> redis::RedisResult<BTreeSet<String>> {
    let mut list = redis::cmd("FUNCTION");
    list.arg("LIST")
        .arg("LIBRARYNAME")
        .arg(format!("{PREFIX}*"));
    let Conn::Cluster(cluster, _) = conn else {
        return Ok(names_listed(&conn.query(&list).await?)
            .into_iter()
            .collect());
    };
    let every_master = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let Value::Map(replies) = cluster.route_command(list, every_master).await? else {
        return Ok(BTreeSet::new());
    };
    Ok(replies
        .iter()
        .flat_map(|(_node, reply)| names_listed(reply))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_tells_its_release_and_only_this_crates_names_do() {
        let name = library_name("sem_force_unlock.lua", "0123456789abcdef0123");
        assert!(
            name.ends_with("_sem_force_unlock_0123456789abcdef"),
            "{name}"
        );
        assert_eq!(release_of(&name), Some(this_release()));
        assert_eq!(
            release_of("tower_redis_lock_0_9_12_acquire_0123456789abcdef"),
            Some([0, 9, 12])
        );
        assert_eq!(release_of("tower_redis_lock_acquire_0123"), None);
        assert_eq!(release_of("mylib"), None);
        assert!([0, 9, 12] < [0, 10, 0] && [1, 0, 0] > [0, 99, 99]);
    }

    #[test]
    fn the_names_of_a_function_list_reply() {
        let library = |name: &str| {
            Value::Array(vec![
                Value::BulkString(b"library_name".to_vec()),
                Value::BulkString(name.as_bytes().to_vec()),
                Value::BulkString(b"engine".to_vec()),
                Value::BulkString(b"LUA".to_vec()),
            ])
        };
        let listed = Value::Array(vec![library("a"), library("b")]);
        assert_eq!(names_listed(&listed), ["a", "b"]);
    }
}
