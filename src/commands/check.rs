//! `fencecron check`: validate the config and show each job's next fire
//! times.

use chrono::Utc;

use crate::cli::Cli;
use crate::error::{Exit, Result};
use crate::output::Out;
use crate::store::rfc3339;

use super::Context;

pub fn run(cli: &Cli) -> Result<Exit> {
    let ctx = Context::load(cli, true)?;
    let Some(config) = ctx.config else {
        return Ok(Exit::Success);
    };
    let mut out = Out::stdout();
    writeln!(
        out,
        "{}: ok, {} job(s), store {}",
        config.path.display(),
        config.jobs.len(),
        ctx.store_url
    )?;
    let now = Utc::now();
    for job in &config.jobs {
        writeln!(
            out,
            "job {} (resource {}, schedule \"{}\" in {}, lease {}, renew every {}, kill grace {})",
            job.name,
            job.resource,
            job.schedule.expr(),
            job.schedule.tz(),
            humantime::format_duration(job.timing.lease),
            humantime::format_duration(job.timing.renew_every),
            humantime::format_duration(job.timing.kill_grace),
        )?;
        let jitter = job.schedule.jitter_offset();
        if !jitter.is_zero() {
            writeln!(
                out,
                "  jitter: every instant +{} (from the job's name; the same on every host)",
                humantime::format_duration(jitter)
            )?;
        }
        for at in job.schedule.upcoming(now, 3) {
            writeln!(out, "  next: {}", rfc3339(at))?;
        }
    }
    Ok(Exit::Success)
}
