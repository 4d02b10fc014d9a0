//! Locking under the workspace's one rule for poison (a lock is poisoned when a thread
//! panicked while holding it):
//!
//! **A poisoned lock is taken as it is, unless a panic can leave its data half-changed;
//! then nobody goes on with that data.**
//!
//! Nearly every lock guards data that each critical section leaves whole at every point
//! where it can panic: one push, insert, remove, swap or store of a whole value, a
//! counter, a queue or a cache entry. Poison then says nothing about the data, and
//! [`lock`], [`try_lock`] and [`recover`] ignore it. Inside `libpadll.so` this is the
//! only choice: the stage runs in other people's processes, where a panic is caught and
//! the call passes through, and its fork handlers may not panic at all.
//!
//! The exceptions are the global and the local controller's state: their critical
//! sections run the policies, build messages and update several tables in turn, so a
//! panic can leave them half-changed. They are locked with [`lock_or_panic`]: after such
//! a panic, whoever locks next panics too, the control loop at the latest, and its
//! supervisor ends the process for the service manager to restart.

use std::sync::{LockResult, Mutex, MutexGuard, PoisonError, TryLockError};

/// Locks `mutex`; a poisoned one is taken as it is (its data is whole: see the module
/// documentation).
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    recover(mutex.lock())
}

/// [`Mutex::try_lock`] under the same rule: `None` only while another thread holds it.
pub fn try_lock<T: ?Sized>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The guard a lock operation returned (a lock, a condition variable's wait), poisoned
/// or not.
pub fn recover<G>(result: LockResult<G>) -> G {
    result.unwrap_or_else(PoisonError::into_inner)
}

/// Locks `mutex`, whose data (`what`, named in the panic) a panic can leave
/// half-changed: a poisoned one panics.
pub fn lock_or_panic<'a, T: ?Sized>(mutex: &'a Mutex<T>, what: &str) -> MutexGuard<'a, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(_) => panic!("{what} was left inconsistent by a panic"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poisoned() -> Mutex<Vec<u32>> {
        let mutex = Mutex::new(vec![1]);
        let _ = std::panic::catch_unwind(|| {
            let _guard = mutex.lock().unwrap();
            panic!("while holding it");
        });
        assert!(mutex.is_poisoned());
        mutex
    }

    #[test]
    fn a_poisoned_lock_is_taken_as_it_is() {
        let mutex = poisoned();
        lock(&mutex).push(2);
        assert_eq!(*try_lock(&mutex).expect("free"), [1, 2]);
        let held = lock(&mutex);
        assert!(std::thread::scope(|s| s
            .spawn(|| try_lock(&mutex).is_none())
            .join()
            .unwrap()));
        drop(held);
    }

    #[test]
    fn state_a_panic_can_leave_half_changed_is_not_used_after_one() {
        let mutex = poisoned();
        let message = std::panic::catch_unwind(|| lock_or_panic(&mutex, "the state").len())
            .expect_err("a poisoned lock was taken");
        assert_eq!(
            message.downcast_ref::<String>().map(String::as_str),
            Some("the state was left inconsistent by a panic")
        );
        assert_eq!(*lock_or_panic(&Mutex::new(3), "the state"), 3);
    }
}
