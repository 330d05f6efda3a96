//! A real `redis-server` for one test (or bench): on a free port of 127.0.0.1, nothing saved to
//! disk, killed when dropped. Shared by `tests/distributed.rs` and `benches/redis.rs`.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| {
        ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("redis-server")
            .to_owned()
    })
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
        .port()
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING (panics with a clear message
    /// if it cannot).
    pub fn start() -> Self {
        let mut server = RedisServer {
            child: None,
            port: free_port(),
        };
        server.restart();
        server
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it (SIGKILL: no goodbye to the clients) and waits until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing was saved).
    pub fn restart(&mut self) {
        self.kill();
        let bin = binary();
        let child = Command::new(&bin)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {bin} ({e}): these tests need a real redis-server \
                     (Debian: apt-get install redis-server; .ci/run installs it)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(self.port) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("{bin} exited at once ({status}) on port {}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "{bin} did not answer PING on port {} within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
