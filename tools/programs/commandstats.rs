//! Reading `INFO commandstats`, shared by the examples that count server commands.

use std::collections::BTreeMap;

/// Calls per command name (`cmdstat_<name>:calls=N,...`), commands run inside scripts
/// included.
pub(crate) fn calls_by_command(stats: &str) -> BTreeMap<String, u64> {
    stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}
