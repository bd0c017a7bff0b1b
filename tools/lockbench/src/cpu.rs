//! The client's CPU time per acquisition: each process reads its own CPU time (user plus
//! system, every thread, from `getrusage(RUSAGE_SELF)`) when the measured window opens and
//! when it closes, and the parent divides the sum over the processes by the acquisitions
//! each process's reading spans. Connecting, warming up and draining stay outside.

use tokio::task::JoinHandle;

use crate::helpers::now_us;
use crate::workload::{CpuWindow, ProcessResult, Schedule};

/// Starts reading the process's CPU time at the window's opening and at its close, on a
/// thread of its own: a reading taken by a task would wait for a busy runtime. Call it
/// before the window opens; the handle gives `None` when the system refuses `getrusage`.
pub(crate) fn measure_window(schedule: Schedule) -> JoinHandle<Option<CpuWindow>> {
    tokio::task::spawn_blocking(move || {
        sleep_until(schedule.measure_us);
        let (from_us, from_cpu) = (now_us(), process_cpu_us()?);
        sleep_until(schedule.stop_us);
        let (to_us, to_cpu) = (now_us(), process_cpu_us()?);
        Some(CpuWindow {
            cpu_us: to_cpu - from_cpu,
            from_us,
            to_us,
        })
    })
}

fn sleep_until(at_us: i64) {
    if let Ok(wait) = u64::try_from(at_us - now_us()) {
        std::thread::sleep(std::time::Duration::from_micros(wait));
    }
}

/// User plus system CPU µs this process has used so far, its ended threads included.
fn process_cpu_us() -> Option<i64> {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeValLike;
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    Some(usage.user_time().num_microseconds() + usage.system_time().num_microseconds())
}

/// Client CPU µs per acquisition over every process: the CPU of their windows summed, over
/// the acquisitions that returned inside each process's own window. `None` when a process
/// could not read its CPU time or no acquisition fell inside.
pub(crate) fn client_cpu_us_per_acq(results: &[ProcessResult]) -> Option<f64> {
    let mut cpu_us = 0;
    let mut acquisitions = 0usize;
    for result in results {
        let window = result.cpu?;
        cpu_us += window.cpu_us;
        acquisitions += result
            .records
            .iter()
            .filter(|record| (window.from_us..window.to_us).contains(&record.acquired_us))
            .count();
    }
    (acquisitions > 0).then(|| cpu_us as f64 / acquisitions as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Record;

    fn record(process: u32, acquired_us: i64) -> Record {
        Record {
            process,
            worker: 0,
            key: 0,
            called_us: acquired_us - 10,
            acquired_us,
            release_called_us: acquired_us + 10,
            released_us: acquired_us + 20,
        }
    }

    fn result(process: u32, acquired: &[i64], cpu: Option<CpuWindow>) -> ProcessResult {
        ProcessResult {
            records: acquired.iter().map(|&at| record(process, at)).collect(),
            round_trips: None,
            increments: 0,
            cpu,
        }
    }

    #[test]
    fn each_process_counts_the_acquisitions_inside_its_own_readings() {
        let window = |cpu_us, from_us, to_us| {
            Some(CpuWindow {
                cpu_us,
                from_us,
                to_us,
            })
        };
        // Process 0: 3 of its 5 acquisitions between its readings (warm-up and drain out).
        // Process 1 read late, so its window is 1000..2500: 2 of its 3 count.
        let results = [
            result(0, &[500, 1000, 1500, 1999, 2000], window(600, 1000, 2000)),
            result(1, &[900, 1200, 2400], window(400, 1000, 2500)),
        ];
        let per_acq = client_cpu_us_per_acq(&results).unwrap();
        assert!((per_acq - 1000.0 / 5.0).abs() < 1e-9, "{per_acq}");
    }

    #[test]
    fn a_process_without_a_reading_or_a_window_without_acquisitions_gives_none() {
        let window = Some(CpuWindow {
            cpu_us: 100,
            from_us: 0,
            to_us: 10,
        });
        assert_eq!(client_cpu_us_per_acq(&[result(0, &[5], None)]), None);
        assert_eq!(client_cpu_us_per_acq(&[result(0, &[50], window)]), None);
        assert_eq!(
            client_cpu_us_per_acq(&[result(0, &[5], window)]),
            Some(100.0)
        );
    }

    #[test]
    fn the_process_cpu_time_grows_with_work() {
        let before = process_cpu_us().unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let after = process_cpu_us().unwrap();
        assert!(after > before, "{before} -> {after} ({x})");
    }
}
