//! Supervision of a controller's long-running tasks (the control loop, the upstream
//! loop, the listeners): each should run for the life of the process, so the first to
//! end — returning, failing or panicking — ends the process with one line saying which
//! and why, and a service manager restarts it. A controller whose control loop died
//! while its sockets still answer would look alive and control nothing.

use std::collections::HashMap;
use std::future::Future;
use tokio::task::{Id, JoinSet};

/// Tasks that must all keep running.
pub struct Supervisor<E> {
    tasks: JoinSet<Result<(), E>>,
    names: HashMap<Id, &'static str>,
}

/// How the first supervised task ended.
#[derive(Debug, PartialEq)]
pub enum Ended<E> {
    /// It returned its error.
    Failed(E),
    /// It returned without one (it should not return at all).
    Returned(&'static str),
    /// It panicked, with this message.
    Panicked(&'static str, String),
}

impl<E> Default for Supervisor<E> {
    fn default() -> Self {
        Supervisor {
            tasks: JoinSet::new(),
            names: HashMap::new(),
        }
    }
}

impl<E: Send + 'static> Supervisor<E> {
    /// Runs `task`, named `name` in the message if it ends (e.g. "the control loop").
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let id = self.tasks.spawn(task).id();
        self.names.insert(id, name);
    }

    /// Waits until the first task ends; the others are aborted when the supervisor is
    /// dropped. Never returns if there are no tasks.
    pub async fn first_end(&mut self) -> Ended<E> {
        let Some(ended) = self.tasks.join_next_with_id().await else {
            return std::future::pending().await;
        };
        match ended {
            Ok((_, Err(error))) => Ended::Failed(error),
            Ok((id, Ok(()))) => Ended::Returned(self.name(id)),
            Err(error) => {
                let name = self.name(error.id());
                match error.try_into_panic() {
                    Ok(panic) => Ended::Panicked(name, panic_message(panic.as_ref())),
                    // Only the supervisor could cancel it, and it has not.
                    Err(_) => Ended::Returned(name),
                }
            }
        }
    }

    fn name(&self, id: Id) -> &'static str {
        self.names.get(&id).copied().unwrap_or("a task")
    }
}

impl<E> Ended<E> {
    /// The error to end the process with: the task's own, or one made by `error` from a
    /// line saying which task ended and how.
    pub fn into_error(self, error: impl FnOnce(String) -> E) -> E {
        match self {
            Ended::Failed(failure) => failure,
            Ended::Returned(name) => error(format!("{name} ended unexpectedly; exiting")),
            Ended::Panicked(name, why) => error(format!("{name} panicked ({why}); exiting")),
        }
    }
}

/// What a panic said (its payload is a `&str` or a `String` unless raised otherwise).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "no message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn forever() -> Result<(), String> {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    }

    #[tokio::test]
    async fn a_panicking_task_is_named_with_its_message() {
        let mut tasks = Supervisor::default();
        tasks.spawn("the admin socket", forever());
        tasks.spawn("the control loop", async {
            let cycle = 3;
            panic!("planner failed in cycle {cycle}")
        });
        let ended = tasks.first_end().await;
        assert_eq!(
            ended,
            Ended::Panicked("the control loop", "planner failed in cycle 3".into())
        );
        assert_eq!(
            ended.into_error(|line| line),
            "the control loop panicked (planner failed in cycle 3); exiting"
        );
    }

    #[tokio::test]
    async fn a_task_that_returns_or_fails_ends_the_wait() {
        let mut tasks = Supervisor::default();
        tasks.spawn("the control loop", forever());
        tasks.spawn("the upstream loop", async { Ok(()) });
        assert_eq!(
            tasks.first_end().await,
            Ended::Returned("the upstream loop")
        );

        let mut tasks = Supervisor::default();
        tasks.spawn("the control loop", forever());
        tasks.spawn("the gRPC server", async { Err("port taken".to_string()) });
        assert_eq!(
            tasks.first_end().await.into_error(|line| line),
            "port taken"
        );
    }
}
