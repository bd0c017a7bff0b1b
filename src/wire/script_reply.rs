//! What a script answers: a status, named (`reply_statuses!`), then the values of that
//! status, named by a struct whose fields' order is their order in the script's table.

use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, Value};

/// Named reply statuses: Rust constants, and the same names bound in a script's Lua. A status
/// followed by values names them in a struct (`STATUS = 1 => Struct { field: type }`), whose
/// fields' order is the order of the values in the script's table after the status; a later
/// status of the same values names the struct alone (`OTHER = 2 => Struct`).
macro_rules! reply_statuses {
    (
        $(#[$doc:meta])* $module:ident {
            $(
                $(#[$status_doc:meta])* $name:ident = $value:expr
                $(=> $values:ident $({
                    $($(#[$field_doc:meta])* $field:ident: $field_type:ty),* $(,)?
                })?)?
            ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        pub(crate) mod $module {
            $(
                $(#[$status_doc])* pub(crate) const $name: i64 = $value;
                $($($crate::wire::script_reply::reply_values! {
                    #[doc = concat!("The values after [`", stringify!($name), "`], in order.")]
                    pub(crate) struct $values {
                        $($(#[$field_doc])* $field: $field_type,)*
                    }
                })?)?
            )*
            /// Every status, by name, for the script's Lua.
            // `()`, no values, where a status has no struct.
            #[allow(unused_parens)]
            pub(crate) const ALL: &[$crate::wire::script_reply::Status] = &[$(
                $crate::wire::script_reply::Status {
                    name: stringify!($name),
                    value: $value,
                    least_values:
                        <($($values)?) as $crate::wire::script_reply::ReplyValues>::LEAST,
                    most_values: <($($values)?) as $crate::wire::script_reply::ReplyValues>::MOST,
                }
            ),*];
        }
    };
}
pub(crate) use reply_statuses;

/// The values a script's reply gives after its status, named: the fields' order is the
/// order of the values in the script's table.
macro_rules! reply_values {
    (
        $(#[$doc:meta])* $vis:vis struct $values:ident {
            $($(#[$field_doc:meta])* $field:ident: $field_type:ty),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        $vis struct $values {
            $($(#[$field_doc])* pub(crate) $field: $field_type,)*
        }

        impl $crate::wire::script_reply::ReplyValues for $values {
            const LEAST: usize =
                0 $(+ <$field_type as $crate::wire::script_reply::ReplyValue>::LEAST)*;
            const MOST: usize = 0_usize
                $(.saturating_add(<$field_type as $crate::wire::script_reply::ReplyValue>::MOST))*;

            fn take(
                values: &mut $crate::wire::script_reply::Values<'_>,
            ) -> redis::RedisResult<Self> {
                Ok(Self {
                    $($field: $crate::wire::script_reply::ReplyValue::take(values)?,)*
                })
            }
        }
    };
}
pub(crate) use reply_values;

/// A reply status, named, with how many values may follow it in the script's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status {
    pub(crate) name: &'static str,
    pub(crate) value: i64,
    /// At least this many values follow it (a short reply leaves out the last ones).
    pub(crate) least_values: usize,
    /// At most this many.
    pub(crate) most_values: usize,
}

/// A script's reply: its status (one of its description's), then its values.
pub(crate) struct ScriptReply {
    script: &'static str,
    values: Vec<Value>,
}

/// The values of a reply after its status, in order, as its struct's fields take them.
pub(crate) type Values<'r> = std::slice::Iter<'r, Value>;

impl ScriptReply {
    pub(crate) fn new(script: &'static str, values: Vec<Value>) -> Self {
        Self { script, values }
    }

    /// The status the reply starts with.
    pub(crate) fn status(&self) -> i64 {
        let status = self.values.first().map(i64::from_redis_value_ref);
        status.and_then(Result::ok).unwrap_or(i64::MIN)
    }

    /// The values after the status, as the struct `T` that names them; an error when one is
    /// not of its field's type.
    pub(crate) fn values<T: ReplyValues>(&self) -> RedisResult<T> {
        T::take(&mut self.values.get(1..).unwrap_or(&[]).iter()).map_err(|err| {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "a script answered a value of another type than its struct names",
                format!("{}: {:?}: {err}", self.script, self.values),
            ))
        })
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

impl ScriptReply {
    /// The reply `value` of `script`, whose one integer alone stands for `{status, integer}`
    /// when it has a `short_reply` status.
    pub(crate) fn read(
        script: &'static str,
        value: redis::Value,
        short_reply: Option<i64>,
    ) -> RedisResult<Self> {
        let values = match (value, short_reply) {
            (Value::Int(figure), Some(status)) => vec![Value::Int(status), Value::Int(figure)],
            (Value::Array(values), _) => values,
            (value, _) => {
                return Err(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "a script answered no table",
                    format!("{script}: {value:?}"),
                )));
            }
        };
        Ok(Self::new(script, values))
    }
}

/// The values a reply gives after one status, named (made by `reply_statuses!`).
pub(crate) trait ReplyValues: Sized {
    /// At least how many values it takes.
    const LEAST: usize;
    /// At most how many.
    const MOST: usize;
    /// Takes its values in order from `values`.
    fn take(values: &mut Values<'_>) -> RedisResult<Self>;
}

/// No values: a status alone.
impl ReplyValues for () {
    const LEAST: usize = 0;
    const MOST: usize = 0;

    fn take(_: &mut Values<'_>) -> RedisResult<Self> {
        Ok(())
    }
}

/// One field of [`ReplyValues`], taking what it needs of the reply's values.
pub(crate) trait ReplyValue: Sized {
    /// At least how many values it takes.
    const LEAST: usize;
    /// At most how many.
    const MOST: usize;
    /// Takes its value (or values) from `values`.
    fn take(values: &mut Values<'_>) -> RedisResult<Self>;
}

/// A figure that may be below zero; 0 when the reply ends before it.
impl ReplyValue for i64 {
    const LEAST: usize = 1;
    const MOST: usize = 1;

    fn take(values: &mut Values<'_>) -> RedisResult<Self> {
        match values.next() {
            Some(value) => Ok(i64::from_redis_value_ref(value)?),
            None => Ok(0),
        }
    }
}

/// A word, such as a replication id; empty when the reply ends before it.
impl ReplyValue for String {
    const LEAST: usize = 1;
    const MOST: usize = 1;

    fn take(values: &mut Values<'_>) -> RedisResult<Self> {
        match values.next() {
            Some(value) => Ok(String::from_redis_value_ref(value)?),
            None => Ok(String::new()),
        }
    }
}

/// A count or a time: 0 when below zero, or when the reply ends before it.
impl ReplyValue for u64 {
    const LEAST: usize = 1;
    const MOST: usize = 1;

    fn take(values: &mut Values<'_>) -> RedisResult<Self> {
        Ok(u64::try_from(i64::take(values)?).unwrap_or(0))
    }
}

/// A value a short reply leaves out: `None` then.
impl<T: ReplyValue> ReplyValue for Option<T> {
    const LEAST: usize = 0;
    const MOST: usize = T::MOST;

    fn take(values: &mut Values<'_>) -> RedisResult<Self> {
        if values.as_slice().is_empty() {
            return Ok(None);
        }
        T::take(values).map(Some)
    }
}

/// Every value left, in order (a value per item of the script's batch).
impl ReplyValue for Vec<i64> {
    const LEAST: usize = 0;
    const MOST: usize = usize::MAX;

    fn take(values: &mut Values<'_>) -> RedisResult<Self> {
        let mut each = Vec::with_capacity(values.len());
        while values.len() > 0 {
            each.push(i64::take(values)?);
        }
        Ok(each)
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    crate::wire::script_reply::reply_statuses! {
        /// Statuses for the test.
        sample {
            /// A status with values, the last two of which a short reply leaves out.
            DONE = 1 => Done { first: u64, second: Option<i64>, third: Option<u64> },
            /// A status with a value per item.
            PER_ITEM = 2 => PerItem { count: u64, each: Vec<i64> },
        }
    }

    #[test]
    fn a_short_reply_stands_for_its_status_and_one_figure_and_a_table_is_read_whole() {
        let short = ScriptReply::read("a.lua", Value::Int(42), Some(1)).expect("read");
        let values: sample::Done = short.values().expect("numbers");
        assert_eq!(short.status(), sample::DONE);
        assert_eq!(
            (values.first, values.second, values.third),
            (42, None, None)
        );
        let table = Value::Array(vec![Value::Int(1), Value::Int(-2), Value::Int(-7)]);
        let whole = ScriptReply::read("a.lua", table, Some(1)).expect("read");
        let values: sample::Done = whole.values().expect("numbers");
        assert_eq!(
            (values.first, values.second, values.third),
            (0, Some(-7), None),
            "a count below zero is 0; each field takes the next value"
        );
        let table = Value::Array(vec![
            Value::Int(2),
            Value::Int(3),
            Value::Int(1),
            Value::Int(-1),
        ]);
        let per_item = ScriptReply::read("a.lua", table, None).expect("read");
        assert_eq!(per_item.status(), sample::PER_ITEM);
        let per_item: sample::PerItem = per_item.values().expect("numbers");
        assert_eq!((per_item.count, per_item.each), (3, vec![1, -1]));
        let counts: Vec<_> = sample::ALL
            .iter()
            .map(|status| {
                (
                    status.name,
                    status.value,
                    status.least_values,
                    status.most_values,
                )
            })
            .collect();
        assert_eq!(
            counts,
            [("DONE", 1, 1, 3), ("PER_ITEM", 2, 1, usize::MAX)],
            "a value a short reply leaves out, or a value per item, may be missing"
        );
        assert!(ScriptReply::read("a.lua", Value::Int(42), None).is_err());
        let word = Value::BulkString(b"x".to_vec());
        let table = Value::Array(vec![Value::Int(1), Value::Int(3), word]);
        let wrong = ScriptReply::read("a.lua", table, None).expect("read");
        assert!(
            wrong.values::<sample::Done>().is_err(),
            "a word where a number belongs is an error, not 0"
        );
    }
}
