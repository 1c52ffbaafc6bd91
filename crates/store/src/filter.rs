//! The conditions of a job list (`GET /v1/jobs`), decided once for both stores: each is a SQL
//! fragment with `?` for its values and the values themselves. A backend only renders `?` as its
//! own placeholder and binds the values in its own types.

use overseer_core::{JobId, Timestamp};

use crate::JobQuery;

/// A value a condition binds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Arg {
    Text(String),
    Id(JobId),
    Millis(i64),
}

/// One `AND`ed condition on the `jobs` table.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cond {
    pub sql: &'static str,
    pub args: Vec<Arg>,
}

fn cond(sql: &'static str, args: Vec<Arg>) -> Cond {
    Cond { sql, args }
}

/// The conditions of `q`, cheapest first.
pub(crate) fn job_conditions(q: &JobQuery) -> Vec<Cond> {
    let mut out = Vec::new();
    if let Some((lo, hi)) = q.ids {
        out.push(cond("id BETWEEN ? AND ?", vec![Arg::Id(lo), Arg::Id(hi)]));
    }
    if let Some(before) = q.before {
        out.push(cond("id < ?", vec![Arg::Id(before)]));
    }
    if let Some(state) = q.state {
        out.push(cond("state = ?", vec![Arg::Text(state.as_str().into())]));
    }
    if let Some(from) = q.created_from {
        out.push(cond("created_at >= ?", vec![millis(from)]));
    }
    if let Some(before) = q.created_before {
        out.push(cond("created_at < ?", vec![millis(before)]));
    }
    for (key, value) in &q.labels {
        out.push(cond(
            "id IN (SELECT job_id FROM job_labels WHERE key = ? AND value = ?)",
            vec![Arg::Text(key.clone()), Arg::Text(value.clone())],
        ));
    }
    if let Some(name) = &q.submitted_by {
        out.push(cond("submitted_by = ?", vec![Arg::Text(name.clone())]));
    }
    if let Some(agent) = &q.agent {
        out.push(cond(
            "EXISTS (SELECT 1 FROM steps AS s WHERE s.job_id = jobs.id AND s.agent = ?)",
            vec![Arg::Text(agent.clone())],
        ));
    }
    out
}

fn millis(t: Timestamp) -> Arg {
    Arg::Millis(t.as_millis())
}

/// `SELECT id FROM jobs WHERE …` for `q`, newest first, with `?` placeholders, and its values
/// (the limit last).
pub(crate) fn job_list_sql(q: &JobQuery) -> (String, Vec<Arg>) {
    let mut sql = String::from("SELECT id FROM jobs WHERE true");
    let mut args = Vec::new();
    for c in job_conditions(q) {
        sql.push_str(" AND ");
        sql.push_str(c.sql);
        args.extend(c.args);
    }
    sql.push_str(" ORDER BY id DESC LIMIT ?");
    (sql, args)
}

/// `sql` with each `?` numbered as PostgreSQL wants it (`$1`, `$2`, …).
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves placeholders are numbered in order for PostgreSQL and every filter binds its values.
    #[test]
    fn conditions_render_for_both_dialects() {
        let q = JobQuery {
            agent: Some("dns".into()),
            labels: vec![("team".into(), "a".into())],
            ..JobQuery::default()
        };
        let (sql, args) = job_list_sql(&q);
        assert_eq!(args.len(), 3);
        assert_eq!(
            sql.matches('?').count(),
            4,
            "three values and the limit: {sql}"
        );
        let pg = numbered(&sql);
        assert!(
            pg.contains("$1") && pg.contains("$4") && !pg.contains('?'),
            "{pg}"
        );
    }
}
