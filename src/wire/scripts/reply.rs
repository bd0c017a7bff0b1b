//! What a script answered: a status, then its values.

use redis::{ErrorKind, RedisError, RedisResult};

/// A script's reply: its status (one of its description's), then its values.
pub(crate) struct ScriptReply {
    script: &'static str,
    values: Vec<i64>,
}

impl ScriptReply {
    pub(crate) fn new(script: &'static str, values: Vec<i64>) -> Self {
        Self { script, values }
    }

    /// The status the reply starts with.
    pub(crate) fn status(&self) -> i64 {
        self.values.first().copied().unwrap_or(i64::MIN)
    }

    /// The `n`-th value after the status (0 when the reply has none there).
    pub(crate) fn value(&self, n: usize) -> i64 {
        self.values.get(n + 1).copied().unwrap_or(0)
    }

    /// The `n`-th value after the status, or `default` when the reply has none there (a
    /// short reply).
    pub(crate) fn value_or(&self, n: usize, default: i64) -> i64 {
        self.values.get(n + 1).copied().unwrap_or(default)
    }

    /// [`Self::value`], where a negative value means none: 0.
    pub(crate) fn non_negative(&self, n: usize) -> u64 {
        u64::try_from(self.value(n)).unwrap_or(0)
    }

    /// The values after the status.
    pub(crate) fn after_status(&self) -> &[i64] {
        self.values.get(1..).unwrap_or(&[])
    }

    /// The error of a status the script's description does not name.
    pub(crate) fn unknown(&self) -> RedisError {
        RedisError::from((
            ErrorKind::Client,
            "a script answered a status its description does not name",
            format!("{}: {:?}", self.script, self.values),
        ))
    }
}

/// Runs a script's command and reads its reply.
pub(crate) async fn run<const KEYS: usize, const ARGS: usize>(
    script: &crate::wire::script::ScriptSpec<KEYS, ARGS>,
    conn: &mut crate::wire::conn::Conn,
    cmd: &redis::Cmd,
) -> RedisResult<ScriptReply> {
    let value = script.lua().run(conn, cmd).await?;
    ScriptReply::read(script.file, value, script.short_reply)
}

impl ScriptReply {
    /// The reply `value` of `script`, whose one integer alone stands for `{status, integer}`
    /// when it has a `short_reply` status.
    pub(crate) fn read(
        script: &'static str,
        value: redis::Value,
        short_reply: Option<i64>,
    ) -> RedisResult<Self> {
        let values = match (value, short_reply) {
            (redis::Value::Int(figure), Some(status)) => vec![status, figure],
            (value, _) => redis::from_redis_value(value)?,
        };
        Ok(Self::new(script, values))
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    #[test]
    fn a_short_reply_stands_for_its_status_and_one_figure_and_a_table_is_read_whole() {
        let short = ScriptReply::read("a.lua", Value::Int(42), Some(1)).expect("read");
        assert_eq!((short.status(), short.after_status()), (1, &[42][..]));
        assert_eq!(short.value_or(1, 30_000), 30_000);
        let table = Value::Array(vec![Value::Int(0), Value::Int(-2), Value::Int(7)]);
        let whole = ScriptReply::read("a.lua", table, Some(1)).expect("read");
        assert_eq!(
            (whole.status(), whole.value(0), whole.non_negative(0)),
            (0, -2, 0)
        );
        assert_eq!(whole.value_or(1, 30_000), 7);
        assert!(ScriptReply::read("a.lua", Value::Int(42), None).is_err());
    }
}
