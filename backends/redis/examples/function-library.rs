//! Prints Tollgate's Redis function library, for an administrator to load
//! once where stores run with `Engine::PreloadedFunctions` (their Redis
//! user may call it but not load or replace any library):
//!
//! ```sh
//! cargo run -q -p tollgate-redis --example function-library \
//!   | redis-cli -u "$ADMIN_URL" -x FUNCTION LOAD REPLACE
//! ```
//!
//! Redis answers the library's name (`tollgate_<16 hex digits>`: the
//! digits change with its code, so an upgrade of Tollgate needs a load of
//! its own). On a Cluster, load it on every master (`redis-cli --cluster
//! call <node> FUNCTION LOAD REPLACE …`, or once per master). See
//! docs/operations.md, "Least privilege".

fn main() {
    print!("{}", tollgate_redis::function_library());
}
