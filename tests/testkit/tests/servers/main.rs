//! The test servers' own tests, one binary (each file a module; the missing-
//! server checks keep their own binaries: the binary check is cached per
//! process).

mod redis_cluster;
mod redis_server;
