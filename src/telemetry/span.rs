//! Random ids and clocks for spans: trace ids (16 bytes) and span ids (8
//! bytes) from `/dev/urandom` (never all zero), and unix nanoseconds.

pub use crate::proto::cmd::{AttrValue, Span, SpanId, SpanKind, SpanLink, TraceId, TraceParent};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `N` random bytes from `/dev/urandom`; should it be unreadable (it is
/// always there on Linux), a mix of the clock, the pid and a counter, so ids
/// stay distinct within the process.
fn random<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut out));
    if read.is_err() || out.iter().all(|b| *b == 0) {
        static N_: AtomicU64 = AtomicU64::new(1);
        let mut x =
            now_ns() ^ (u64::from(std::process::id()) << 32) ^ N_.fetch_add(1, Ordering::Relaxed);
        for b in out.iter_mut() {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            *b = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8;
        }
        if out.iter().all(|b| *b == 0) {
            out[N - 1] = 1;
        }
    }
    out
}

pub fn trace_id() -> TraceId {
    TraceId(random())
}

pub fn span_id() -> SpanId {
    SpanId(random())
}

/// A random UUID (version 4), for `service.instance.id`.
pub fn uuid4() -> String {
    let mut b: [u8; 16] = random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = crate::proto::cmd::hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Now, in unix nanoseconds.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_never_zero() {
        let (a, b) = (trace_id(), trace_id());
        assert_ne!(a, b);
        assert!(a.0.iter().any(|x| *x != 0));
        assert!(TraceId::parse(&a.hex()).is_some());
        assert!(SpanId::parse(&span_id().hex()).is_some());
        let u = uuid4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
