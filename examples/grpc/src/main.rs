//! `cargo run -p tollgate-example-grpc`: three health checks against a
//! limit of two per minute, printed as tonic's client sees them.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for (i, call) in tollgate_example_grpc::run().await?.iter().enumerate() {
        println!("call {}: {call}", i + 1);
    }
    Ok(())
}
