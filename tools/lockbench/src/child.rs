//! The second process of a two-process run: this binary re-run with `--child`, driven over
//! its stdin and stdout with one JSON message a line.

use std::process::Stdio;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::helpers::Res;
use crate::worker::{execute, prepare};
use crate::workload::{ProcessResult, RunSpec, Schedule};

/// Parent to child, one JSON line each.
#[derive(Serialize, Deserialize)]
enum ToChild {
    Prepare(RunSpec),
    Go(Schedule),
}

/// Child to parent, one JSON line each.
#[derive(Serialize, Deserialize)]
enum FromChild {
    Ready,
    Done(ProcessResult),
}

/// The child's side: prepare, say ready, wait for the schedule, run, report.
pub(crate) async fn child_main() -> Res<()> {
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut output = tokio::io::stdout();
    let ToChild::Prepare(spec) = read_message(&mut input).await? else {
        return Err("expected Prepare first".into());
    };
    let prepared = prepare(spec).await?;
    write_message(&mut output, &FromChild::Ready).await?;
    let ToChild::Go(schedule) = read_message(&mut input).await? else {
        return Err("expected Go after Prepare".into());
    };
    let result = execute(prepared, schedule).await?;
    write_message(&mut output, &FromChild::Done(result)).await
}

/// The parent's handle on a child process; the child is killed if this is dropped early.
pub(crate) struct ChildProcess {
    process: Child,
    input: ChildStdin,
    output: Lines<BufReader<ChildStdout>>,
}

impl ChildProcess {
    /// Starts this binary again with `--child` and hands it its part of the run.
    pub(crate) async fn start(spec: RunSpec) -> Res<Self> {
        let mut process = tokio::process::Command::new(std::env::current_exe()?)
            .arg("--child")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let input = process.stdin.take().ok_or("child has no stdin")?;
        let output = BufReader::new(process.stdout.take().ok_or("child has no stdout")?).lines();
        let mut child = Self {
            process,
            input,
            output,
        };
        write_message(&mut child.input, &ToChild::Prepare(spec)).await?;
        Ok(child)
    }

    /// Waits until the child has connected and warmed up, so its set-up stays out of the
    /// figures.
    pub(crate) async fn ready(&mut self) -> Res<()> {
        match read_message(&mut self.output).await? {
            FromChild::Ready => Ok(()),
            FromChild::Done(_) => Err("child finished before it was ready".into()),
        }
    }

    /// Hands the child the schedule both processes start on.
    pub(crate) async fn go(&mut self, schedule: Schedule) -> Res<()> {
        write_message(&mut self.input, &ToChild::Go(schedule)).await
    }

    /// The child's records, once it has exited cleanly.
    pub(crate) async fn finish(mut self) -> Res<ProcessResult> {
        let FromChild::Done(result) = read_message(&mut self.output).await? else {
            return Err("child said Ready twice".into());
        };
        let status = self.process.wait().await?;
        if !status.success() {
            return Err(format!("child exited with {status}").into());
        }
        Ok(result)
    }
}

async fn read_message<T, R>(lines: &mut Lines<R>) -> Res<T>
where
    T: serde::de::DeserializeOwned,
    R: tokio::io::AsyncBufRead + Unpin,
{
    let line = lines
        .next_line()
        .await?
        .ok_or("the other process closed the pipe")?;
    Ok(serde_json::from_str(&line)?)
}

async fn write_message<T: Serialize>(
    writer: &mut (impl tokio::io::AsyncWrite + Unpin),
    message: &T,
) -> Res<()> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    writer.write_all(&line).await?;
    writer.flush().await?;
    Ok(())
}
