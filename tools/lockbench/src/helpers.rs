//! Small helpers every part shares: the error type, the connection, the wall clock both
//! processes read, and the arithmetic of percentiles and number formatting.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;

/// Every failure ends the benchmark (exit code 3): only its message is reported, so one boxed
/// error type serves every part.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The result of anything that talks to Redis or to the other process.
pub(crate) type Res<T> = Result<T, BoxError>;

/// A multiplexed connection: many workers share it without waiting for each other's
/// replies.
pub(crate) async fn connect(url: &str) -> Res<MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// Wall-clock microseconds since the Unix epoch: comparable between processes on one machine.
pub(crate) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as i64)
}

pub(crate) fn micros(duration: Duration) -> i64 {
    duration.as_micros() as i64
}

/// Sleeps until the wall clock reads `at_us`.
pub(crate) async fn sleep_until(at_us: i64) {
    if let Ok(wait) = u64::try_from(at_us - now_us()) {
        tokio::time::sleep(Duration::from_micros(wait)).await;
    }
}

pub(crate) fn sorted(values: impl Iterator<Item = i64>) -> Vec<i64> {
    let mut values: Vec<i64> = values.collect();
    values.sort_unstable();
    values
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[i64], p: usize) -> Option<f64> {
    per_mille(sorted, p * 10)
}

/// Nearest-rank quantile of sorted values in thousandths, for the tail a percentile cannot
/// name (999: the 99.9th percentile).
pub(crate) fn per_mille(sorted: &[i64], p: usize) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() - 1) * p) / 1000] as f64)
}

pub(crate) fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[middle]),
        _ => Some((values[middle - 1] + values[middle]) / 2.0),
    }
}

pub(crate) fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

pub(crate) fn fixed(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |value| format!("{value:.decimals$}"))
}

pub(crate) fn us(value: Option<f64>) -> String {
    fixed(value, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_hundredths_and_thousandths() {
        let values: Vec<i64> = (1..=1001).collect();
        assert_eq!(percentile(&values, 10), Some(101.0));
        assert_eq!(percentile(&values, 50), Some(501.0));
        assert_eq!(percentile(&values, 99), Some(991.0));
        assert_eq!(per_mille(&values, 999), Some(1000.0));
        assert_eq!(per_mille(&values, 1000), Some(1001.0));
        assert_eq!(per_mille(&[], 999), None);
    }
}
