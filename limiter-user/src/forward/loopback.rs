//! Loopback sockets for the copy path's and the batch's tests.

use tokio::net::{TcpListener, TcpStream};

/// A connected pair on loopback: (the peer's end, the forwarder's end).
pub async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (ours, _) = l.accept().await.unwrap();
    (peer, ours)
}

/// A byte pattern that shows a lost, doubled or reordered byte.
pub fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| u8::try_from((i * 7 + seed) % 251).unwrap()).collect()
}
