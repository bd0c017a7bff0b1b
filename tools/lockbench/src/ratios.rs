//! The summary's ratios against rslock, per workload: each other lock's rate and CPU per
//! acquisition (the client's and Redis's) over rslock's, from the medians of the same run,
//! so a rate ratio is always read next to what each acquisition cost.

use crate::figures::Figures;
use crate::summary::SummaryRow;
use crate::workload::{Implementation, Workload};

/// One lock's figures over rslock's on one workload; `None` where either is missing.
#[derive(Debug, PartialEq)]
pub(crate) struct Ratio {
    pub(crate) workload: Workload,
    pub(crate) lock: Implementation,
    /// Acquisitions per second: above 1 is faster than rslock.
    pub(crate) acq_per_s: Option<f64>,
    /// Client CPU per acquisition: above 1 costs each instance more than rslock.
    pub(crate) client_cpu_per_acq: Option<f64>,
    /// Redis CPU per acquisition: above 1 costs the shared server more than rslock.
    pub(crate) server_cpu_per_acq: Option<f64>,
}

/// Every lock but rslock against rslock, on each workload rslock ran, in the summary's order.
pub(crate) fn against_rslock(rows: &[SummaryRow]) -> Vec<Ratio> {
    rows.iter()
        .filter(|row| row.lock != Implementation::Rslock)
        .filter_map(|row| {
            let rslock = rows.iter().find(|other| {
                other.lock == Implementation::Rslock && other.workload == row.workload
            })?;
            let over = |field: fn(&Figures) -> Option<f64>| {
                divided(field(&row.figures), field(&rslock.figures))
            };
            Some(Ratio {
                workload: row.workload,
                lock: row.lock,
                acq_per_s: over(|f| Some(f.acq_per_s)),
                client_cpu_per_acq: over(|f| f.client_cpu_us_per_acq),
                server_cpu_per_acq: over(|f| f.server_cpu_us_per_acq),
            })
        })
        .collect()
}

/// `a / b`, or `None` when either is missing or `b` is not above 0.
fn divided(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    let b = b.filter(|b| *b > 0.0)?;
    Some(a? / b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(lock: Implementation, workload: Workload, rate: f64, cpu: Option<f64>) -> SummaryRow {
        SummaryRow {
            lock,
            workload,
            reps: 3,
            loads_before: vec![Some(0.2); 3],
            figures: Figures {
                acq_per_s: rate,
                client_cpu_us_per_acq: cpu.map(|cpu| cpu * 2.0),
                server_cpu_us_per_acq: cpu,
                ..Figures::default()
            },
        }
    }

    #[test]
    fn each_lock_is_divided_by_rslock_on_the_same_workload() {
        let w16 = Workload::new(16, 1, false);
        let w8 = Workload::new(8, 2, true);
        let rows = [
            row(Implementation::Ours, w16, 30_000.0, Some(38.0)),
            row(Implementation::OursPerWorker, w16, 34_800.0, None),
            row(Implementation::Rslock, w16, 60_000.0, Some(20.0)),
            // No rslock on this workload: no ratio.
            row(Implementation::Ours, w8, 5_000.0, Some(10.0)),
        ];
        let ratios = against_rslock(&rows);
        assert_eq!(
            ratios,
            [
                Ratio {
                    workload: w16,
                    lock: Implementation::Ours,
                    acq_per_s: Some(0.5),
                    client_cpu_per_acq: Some(1.9),
                    server_cpu_per_acq: Some(1.9),
                },
                Ratio {
                    workload: w16,
                    lock: Implementation::OursPerWorker,
                    acq_per_s: Some(0.58),
                    client_cpu_per_acq: None,
                    server_cpu_per_acq: None,
                },
            ]
        );
    }

    #[test]
    fn nothing_is_divided_by_zero_or_a_missing_figure() {
        assert_eq!(divided(Some(1.0), Some(0.0)), None);
        assert_eq!(divided(Some(1.0), None), None);
        assert_eq!(divided(None, Some(2.0)), None);
        assert_eq!(divided(Some(1.0), Some(4.0)), Some(0.25));
    }
}
