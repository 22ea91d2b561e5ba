//! The fleet statements run: [`FleetDb`] for every sqlx database whose
//! connections execute queries and whose rows give back text and integers
//! by column name.

use super::*;

#[async_trait]
impl<DB> FleetDb for DB
where
    DB: Database + sqlx::database::HasStatementCache,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB>,
    for<'q> Option<&'q str>: Encode<'q, DB>,
    i64: for<'r> Decode<'r, DB>,
    String: Type<DB> + for<'r> Decode<'r, DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
    DB::QueryResult: Affected,
{
    async fn finish_run(
        pool: &Pool<Self>,
        sql: &FleetSql,
        end: &RunEnd<'_>,
    ) -> Result<bool, sqlx::Error> {
        let done = bind_end(sqlx::query(&sql.finish_run), end)
            .execute(pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn forget_unrun(
        pool: &Pool<Self>,
        sql: &FleetSql,
        resource: &str,
        owner_id: OwnerId,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(&sql.forget_unrun)
            .bind(resource)
            .bind(owner_id.as_str())
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn preempt(
        pool: &Pool<Self>,
        sql: &FleetSql,
        resource: &str,
        token: Token,
        occurrence: StoreTime,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&sql.preempt)
            .bind(resource)
            .bind(token)
            .bind(occurrence.0)
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn runs(
        pool: &Pool<Self>,
        sql: &FleetSql,
        q: &RunQuery<'_>,
        now: StoreTime,
    ) -> Result<Vec<RunInfo>, sqlx::Error> {
        let job = q.job.unwrap_or("");
        let outcome = q.outcome.map_or("", RunOutcome::as_str);
        let node = q.node.unwrap_or("");
        let owner_id = q.owner_id.as_ref().map_or("", OwnerId::as_str);
        let found = sqlx::query(&sql.runs)
            .bind(job)
            .bind(job)
            .bind(q.since.map_or(i64::MIN, |s| s.0))
            .bind(outcome)
            .bind(outcome)
            .bind(node)
            .bind(node)
            .bind(owner_id)
            .bind(owner_id)
            .bind(i64::from(q.limit))
            .fetch_all(pool)
            .await?;
        found
            .iter()
            .map(|r| {
                let token: Token = r.try_get("token")?;
                let owner_id: OwnerId = r.try_get("owner_id")?;
                let lease_fence: Option<Token> = r.try_get("lease_fence")?;
                let lease_owner: Option<OwnerId> = r.try_get("lease_owner_id")?;
                let lease_expires: Option<i64> = r.try_get("lease_expires_at_ms")?;
                let lease = match (lease_fence, lease_owner, lease_expires) {
                    (Some(f), Some(o), Some(e)) => Some((f, o, e)),
                    _ => None,
                };
                let outcome = run_state(r.try_get("outcome")?, token, owner_id, lease, now.0);
                Ok(RunInfo {
                    job: r.try_get("job")?,
                    resource: r.try_get("resource")?,
                    scheduled_at: r
                        .try_get::<Option<i64>, _>("scheduled_at_ms")?
                        .map(StoreTime),
                    trigger: r.try_get("started_by")?,
                    node: r.try_get("node")?,
                    owner_id,
                    token,
                    started_at: StoreTime(r.try_get("started_at_ms")?),
                    finished_at: r
                        .try_get::<Option<i64>, _>("finished_at_ms")?
                        .map(StoreTime),
                    outcome,
                    exit_code: r.try_get("exit_code")?,
                    signal: r.try_get("signal_name")?,
                    duration_ms: r.try_get("duration_ms")?,
                    output: r.try_get("output_tail")?,
                })
            })
            .collect()
    }

    async fn prune_runs(
        pool: &Pool<Self>,
        sql: &FleetSql,
        keep: u32,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error> {
        // At least one per job is always kept: a run in progress is its
        // job's newest.
        let done = sqlx::query(&sql.prune_runs)
            .bind(before.0)
            .bind(i64::from(keep.max(1)))
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn pause(
        pool: &Pool<Self>,
        sql: &FleetSql,
        p: &PauseInfo,
        replace: bool,
    ) -> Result<Option<PauseInfo>, sqlx::Error> {
        // A pause resumed between the refusal and the read leaves no row to
        // report: try again (a bounded number of times; a pause re-made as
        // often is reported as it stands then).
        for _ in 0..3 {
            let mut q = sqlx::query(&sql.pause)
                .bind(p.job.as_str())
                .bind(p.note.as_deref())
                .bind(p.since.0)
                .bind(p.until.map(|u| u.0))
                .bind(p.paused_by.as_str());
            for _ in 0..sql.pause_conditions {
                q = q.bind(i64::from(replace)).bind(p.since.0);
            }
            let affected = q.execute(pool).await?.rows_affected();
            // Inserted or updated (MySQL counts an update twice).
            let ambiguous = sql.pause_conditions > 1 && affected == 1;
            if affected == 2 || (affected == 1 && !ambiguous) {
                return Ok(None);
            }
            let row = sqlx::query(&sql.pause_of)
                .bind(p.job.as_str())
                .fetch_optional(pool)
                .await?;
            let Some(r) = row else { continue };
            let found = PauseInfo {
                job: r.try_get("job")?,
                note: r.try_get("note")?,
                since: StoreTime(r.try_get("since_ms")?),
                until: r.try_get::<Option<i64>, _>("until_ms")?.map(StoreTime),
                paused_by: r.try_get("paused_by")?,
            };
            // MySQL's one row is this very pause when it inserted it.
            return Ok((found != *p).then_some(found));
        }
        Err(sqlx::Error::Protocol(format!(
            "the pause of {} was refused three times by a pause that then vanished",
            p.job
        )))
    }

    async fn resume(pool: &Pool<Self>, sql: &FleetSql, job: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&sql.resume).bind(job).execute(pool).await?;
        Ok(done.rows_affected() > 0)
    }

    async fn pauses(
        pool: &Pool<Self>,
        sql: &FleetSql,
        now: StoreTime,
    ) -> Result<Vec<PauseInfo>, sqlx::Error> {
        let found = sqlx::query(&sql.pauses).bind(now.0).fetch_all(pool).await?;
        found
            .iter()
            .map(|r| {
                Ok(PauseInfo {
                    job: r.try_get("job")?,
                    note: r.try_get("note")?,
                    since: StoreTime(r.try_get("since_ms")?),
                    until: r.try_get::<Option<i64>, _>("until_ms")?.map(StoreTime),
                    paused_by: r.try_get("paused_by")?,
                })
            })
            .collect()
    }

    async fn request_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        t: &TriggerInfo,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&sql.request_trigger)
            .bind(t.id.as_str())
            .bind(t.job.as_str())
            .bind(t.requested_at.0)
            .bind(t.requested_by.as_str())
            .bind(TriggerState::Pending.as_str())
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
    ) -> Result<Option<TriggerInfo>, sqlx::Error> {
        let row = sqlx::query(&sql.trigger)
            .bind(id)
            .fetch_optional(pool)
            .await?;
        row.as_ref().map(trigger_info).transpose()
    }

    async fn pending_triggers(
        pool: &Pool<Self>,
        sql: &FleetSql,
    ) -> Result<Vec<TriggerInfo>, sqlx::Error> {
        let found = sqlx::query(&sql.pending_triggers)
            .bind(TriggerState::Pending.as_str())
            .fetch_all(pool)
            .await?;
        found.iter().map(trigger_info).collect()
    }

    async fn claim_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
        node: &str,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&sql.claim_trigger)
            .bind(TriggerState::Claimed.as_str())
            .bind(node)
            .bind(id)
            .bind(TriggerState::Pending.as_str())
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn settle_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
        state: TriggerState,
        token: Option<Token>,
        detail: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&sql.settle_trigger)
            .bind(state.as_str())
            .bind(token.map(Token::get))
            .bind(detail)
            .bind(id)
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn cancel_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&sql.cancel_trigger)
            .bind(id)
            .bind(TriggerState::Pending.as_str())
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn prune_fleet(
        pool: &Pool<Self>,
        sql: &FleetSql,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error> {
        let t = sqlx::query(&sql.prune_triggers)
            .bind(before.0)
            .execute(pool)
            .await?;
        let p = sqlx::query(&sql.prune_pauses)
            .bind(before.0)
            .execute(pool)
            .await?;
        Ok(t.rows_affected() + p.rows_affected())
    }

    async fn forget(
        pool: &Pool<Self>,
        sql: &FleetSql,
        resource: &str,
        now: StoreTime,
    ) -> Result<Option<bool>, sqlx::Error> {
        let done = sqlx::query(&sql.forget)
            .bind(now.0)
            .bind(resource)
            .bind(now.0)
            .execute(pool)
            .await?;
        if done.rows_affected() > 0 {
            return Ok(Some(true));
        }
        let found = sqlx::query(&sql.lease_exists)
            .bind(resource)
            .fetch_optional(pool)
            .await?;
        Ok(found.map(|_| false))
    }

    async fn prune_kept(
        pool: &Pool<Self>,
        sql: &FleetSql,
        values: bool,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error> {
        let done = if values {
            sqlx::query(&sql.prune_values)
                .bind(before.0)
                .bind(before.0)
                .execute(pool)
                .await?
        } else {
            sqlx::query(&sql.prune_stale)
                .bind(before.0)
                .execute(pool)
                .await?
        };
        Ok(done.rows_affected())
    }

    async fn beat(
        pool: &Pool<Self>,
        sql: &FleetSql,
        beat: &NodeBeat<'_>,
        now: StoreTime,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&sql.beat)
            .bind(beat.node)
            .bind(now.0)
            .bind(beat.hostname)
            .bind(i64::from(beat.pid))
            .bind(beat.version)
            .bind(beat.config_digest)
            .bind(beat.started_at.unwrap_or(now).0)
            .bind(beat.state.as_str())
            .bind(i64::from(beat.running))
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn nodes(pool: &Pool<Self>, sql: &FleetSql) -> Result<Vec<NodeInfo>, sqlx::Error> {
        let found = sqlx::query(&sql.nodes).fetch_all(pool).await?;
        found.iter().map(node_info).collect()
    }

    async fn live_nodes(
        pool: &Pool<Self>,
        sql: &FleetSql,
        now: StoreTime,
    ) -> Result<Vec<NodeInfo>, sqlx::Error> {
        let found = sqlx::query(&sql.live_nodes)
            .bind(NodeState::Stopped.as_str())
            .bind(now.0 - super::super::millis(super::super::NODE_LIVE))
            .fetch_all(pool)
            .await?;
        found.iter().map(node_info).collect()
    }

    async fn publish(
        conn: &mut Self::Connection,
        sql: &FleetSql,
        node: &str,
        jobs: &[crate::store::Definition<'_>],
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&sql.unpublish)
            .bind(node)
            .execute(&mut *conn)
            .await?;
        // Many rows a statement (10,000 jobs were 10,000 statements at
        // every start). Not prepared for reuse: the last chunk's text is
        // its own, and a start or reload publishes once.
        for chunk in super::publish_chunks(jobs) {
            let text = sql.publish(chunk.len());
            let mut query = sqlx::query(&text).persistent(false);
            for (job, digest, definition) in chunk {
                query = query.bind(node).bind(*job).bind(*digest).bind(*definition);
            }
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }

    async fn published(
        pool: &Pool<Self>,
        sql: &FleetSql,
        node: &str,
        definitions: bool,
    ) -> Result<Vec<PublishedJob>, sqlx::Error> {
        let text = if definitions {
            &sql.published_definitions
        } else {
            &sql.published_digests
        };
        let found = sqlx::query(text).bind(node).fetch_all(pool).await?;
        found
            .iter()
            .map(|r| {
                Ok(PublishedJob {
                    node: r.try_get("node")?,
                    job: r.try_get("job")?,
                    digest: r.try_get("digest")?,
                    definition: if definitions {
                        Some(r.try_get("definition")?)
                    } else {
                        None
                    },
                })
            })
            .collect()
    }

    async fn prune_nodes(
        pool: &Pool<Self>,
        sql: &FleetSql,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error> {
        sqlx::query(&sql.prune_node_jobs)
            .bind(before.0)
            .execute(pool)
            .await?;
        let n = sqlx::query(&sql.prune_nodes)
            .bind(before.0)
            .execute(pool)
            .await?;
        Ok(n.rows_affected())
    }
}

/// A trigger row.
fn trigger_info<R>(r: &R) -> Result<TriggerInfo, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    i64: Type<R::Database> + for<'r> Decode<'r, R::Database>,
    String: Type<R::Database> + for<'r> Decode<'r, R::Database>,
{
    Ok(TriggerInfo {
        id: r.try_get("id")?,
        job: r.try_get("job")?,
        requested_at: StoreTime(r.try_get("requested_at_ms")?),
        requested_by: r.try_get("requested_by")?,
        state: domain::stored(&r.try_get::<String, _>("state")?),
        node: r.try_get("node")?,
        token: r.try_get("token")?,
        detail: r.try_get("detail")?,
    })
}
