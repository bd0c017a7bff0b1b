//! A small reader of PromQL, enough to list what a query names: each series selector with its
//! label matchers, and the labels its aggregations and vector matches group by. Syntax is
//! promtool's to check; this only finds the names.

use std::collections::BTreeSet;

/// What one query names.
#[derive(Debug, Default)]
pub(crate) struct Query {
    pub(crate) selectors: Vec<Selector>,
    /// Each `by (...)`, `without (...)`, `on (...)`, ... list, in order.
    groupings: Vec<Vec<String>>,
}

/// A series selector: `name{label="value", ...}`.
#[derive(Debug)]
pub(crate) struct Selector {
    pub(crate) name: String,
    pub(crate) matchers: Vec<Matcher>,
}

/// One label matcher of a selector.
#[derive(Debug)]
pub(crate) struct Matcher {
    pub(crate) label: String,
    op: String,
    value: String,
}

impl Matcher {
    /// The values the matcher names literally: its value for `=` and `!=`, and each
    /// alternative of a `=~` or `!~` that is a plain list (`a|b`). None for a pattern, an
    /// empty value or a dashboard variable.
    pub(crate) fn literal_values(&self) -> Vec<String> {
        let plain = |text: &str| {
            !text.is_empty()
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        match self.op.as_str() {
            "=" | "!=" if plain(&self.value) => vec![self.value.clone()],
            "=~" | "!~" if self.value.split('|').all(plain) => {
                self.value.split('|').map(str::to_owned).collect()
            }
            _ => Vec::new(),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Token {
    Name(String),
    Text(String),
    Punct(String),
    /// A number, a duration or a range: nothing named.
    Other,
}

const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// What may follow an aggregation's name instead of its parenthesis: `sum by (a) (...)`.
const GROUPS: [&str; 2] = ["by", "without"];
const KEYWORDS: [&str; 7] = ["and", "or", "unless", "bool", "offset", "inf", "nan"];

fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        let start = at;
        at += 1;
        if c.is_whitespace() {
            continue;
        }
        if c == '"' || c == '\'' {
            let mut value = String::new();
            while at < chars.len() && chars[at] != c {
                if chars[at] == '\\' {
                    at += 1;
                }
                value.extend(chars.get(at));
                at += 1;
            }
            at += 1;
            tokens.push(Token::Text(value));
        } else if c == '[' {
            while at < chars.len() && chars[at] != ']' {
                at += 1;
            }
            at += 1;
            tokens.push(Token::Other);
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            while at < chars.len()
                && (chars[at].is_ascii_alphanumeric() || "_:".contains(chars[at]))
            {
                at += 1;
            }
            tokens.push(Token::Name(chars[start..at].iter().collect()));
        } else if c.is_ascii_digit() || c == '.' {
            while at < chars.len() && (chars[at].is_ascii_alphanumeric() || chars[at] == '.') {
                at += 1;
            }
            tokens.push(Token::Other);
        } else {
            let pair: String = chars[start..(start + 2).min(chars.len())].iter().collect();
            if ["!=", "=~", "!~", "==", ">=", "<="].contains(&pair.as_str()) {
                at += 1;
                tokens.push(Token::Punct(pair));
            } else {
                tokens.push(Token::Punct(c.to_string()));
            }
        }
    }
    tokens
}

/// Whether `token` is `by` or `without` after an aggregation's name.
fn grouping_word(token: Option<&Token>) -> bool {
    matches!(token, Some(Token::Name(word)) if GROUPS.contains(&word.as_str()))
}

impl Query {
    /// Reads the names of `text`.
    pub(crate) fn parse(text: &str) -> Self {
        let tokens = tokens(text);
        let mut query = Query::default();
        let punct = |at: usize, p: &str| tokens.get(at) == Some(&Token::Punct(p.to_owned()));
        let mut at = 0;
        while at < tokens.len() {
            let Token::Name(name) = &tokens[at] else {
                at += 1;
                continue;
            };
            at += 1;
            if GROUPING.contains(&name.as_str()) {
                if punct(at, "(") {
                    let mut labels = Vec::new();
                    at += 1;
                    while at < tokens.len() && !punct(at, ")") {
                        if let Token::Name(label) = &tokens[at] {
                            labels.push(label.clone());
                        }
                        at += 1;
                    }
                    query.groupings.push(labels);
                }
            } else if punct(at, "(")
                || KEYWORDS.contains(&name.as_str())
                || grouping_word(tokens.get(at))
            {
                // A function or an aggregation, or an operator spelt as a word.
            } else {
                let mut selector = Selector {
                    name: name.clone(),
                    matchers: Vec::new(),
                };
                if punct(at, "{") {
                    at += 1;
                    while let (
                        Some(Token::Name(label)),
                        Some(Token::Punct(op)),
                        Some(Token::Text(value)),
                    ) = (tokens.get(at), tokens.get(at + 1), tokens.get(at + 2))
                    {
                        selector.matchers.push(Matcher {
                            label: label.clone(),
                            op: op.clone(),
                            value: value.clone(),
                        });
                        at += 3;
                        if punct(at, ",") {
                            at += 1;
                        }
                    }
                    assert!(punct(at, "}"), "a matcher not read in `{text}`");
                }
                query.selectors.push(selector);
            }
        }
        query
    }

    /// Every label the query groups or matches by.
    pub(crate) fn grouping_labels(&self) -> impl Iterator<Item = &String> {
        self.groupings.iter().flatten()
    }

    /// The labels the query's outermost aggregation keeps: its first `by (...)` list.
    pub(crate) fn kept_labels(&self) -> BTreeSet<String> {
        self.groupings
            .first()
            .map(|labels| labels.iter().cloned().collect())
            .unwrap_or_default()
    }
}
