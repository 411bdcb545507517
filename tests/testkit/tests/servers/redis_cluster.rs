//! The Redis Cluster harness: forms a 3 + 3 cluster, moves a slot with its
//! keys, survives a killed master, and leaves no process behind.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use tollgate_testkit::redis_cluster::{RedisCluster, Reply, MASTERS};

/// `GET key` on one node, redirections included in the reply.
fn get(cluster: &RedisCluster, node: usize, key: &str) -> Reply {
    cluster.command(node, &["GET", key]).expect("GET")
}

#[test]
fn a_cluster_forms_moves_a_slot_fails_over_and_stops_on_drop() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start();
    println!("cluster formed in {:?}", started.elapsed());
    assert_eq!(cluster.nodes().len(), 2 * MASTERS);
    for master in 0..MASTERS {
        assert_eq!(cluster.replica_of(master), Some(MASTERS + master));
    }

    // A key lands on the master of its slot, and moves with the slot.
    let key = "{harness}:k";
    let slot = cluster.keyslot(key);
    let owner = cluster.master_for_slot(slot);
    assert_eq!(
        cluster.command(owner, &["SET", key, "v", "PX", "60000"]),
        Ok(Reply::Status("OK".into()))
    );
    let to = (owner + 1) % MASTERS;
    let migration = cluster.begin_migration(slot, to);
    assert_eq!(migration.move_keys(10), 1);
    // Moved but not yet handed over: the source redirects with ASK.
    match get(&cluster, owner, key) {
        Reply::Error(e) => assert!(e.starts_with("ASK "), "{e}"),
        other => panic!("expected ASK, got {other:?}"),
    }
    migration.finish();
    assert_eq!(cluster.master_for_slot(slot), to);
    match get(&cluster, owner, key) {
        Reply::Error(e) => assert!(e.starts_with("MOVED "), "{e}"),
        other => panic!("expected MOVED, got {other:?}"),
    }
    assert_eq!(get(&cluster, to, key), Reply::Bulk(Some(b"v".to_vec())));

    // Kill that master: its replica takes over, with the key.
    let replica = cluster.replica_of(to).expect("a replica");
    cluster.kill(to);
    let (promoted, gap) = cluster.wait_for_failover(to, slot);
    println!("failover took {gap:?}");
    assert_eq!(promoted, replica);
    assert_eq!(
        get(&cluster, promoted, key),
        Reply::Bulk(Some(b"v".to_vec()))
    );

    let addrs: Vec<_> = cluster.nodes().iter().map(|n| n.addr()).collect();
    drop(cluster);
    for addr in addrs {
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err(),
            "{addr} still listens after drop"
        );
    }
}
