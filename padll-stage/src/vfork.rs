//! `vfork`: a child that runs in its parent's memory until it calls `exec` or `_exit`.
//!
//! Everything the stage keeps in memory — the descriptor table, the current directory,
//! the thread's counters and credit — is then the parent's. The child's own calls
//! (Python's `subprocess` and Java's `VFORK` launcher close and duplicate descriptors
//! and change directory there before `exec`) would otherwise rewrite the parent's view:
//! after `subprocess.run(cmd, cwd=…)` every relative path and every descriptor the
//! child closed would pass unmanaged in the parent for the rest of its life.
//!
//! So the stage exports its own `vfork`: the same system call as glibc's, which marks
//! the calling thread as *in a vfork child* for the child and restores it in the parent
//! once the child has left. The mark is a value of the thread's shard-cache word
//! (initial-exec TLS, which the child shares) that is no shard, so the hooks' fast path
//! (which does not look for the mark) sends every call to the out-of-line path, which
//! looks for it before anything else and then calls the real function, nothing more.
//! The child's calls are neither throttled nor counted; after `exec` the new program
//! loads its own stage. `posix_spawn` (and so `system` and `popen`) needs none of this:
//! glibc's child makes only internal calls, which no hook sees.
//!
//! x86-64 only, like the shard cache that holds the mark; elsewhere `vfork` is glibc's
//! and a vfork child's calls act on the parent's state as before (docs/stage.md).

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use crate::{errno, stats};
    use libc::{c_int, pid_t};

    /// Whether the calling thread is a vfork child that has not left yet.
    #[inline(always)]
    pub(crate) fn in_child() -> bool {
        stats::in_vfork_child()
    }

    /// Before the system call: marks the thread for the child (in its shard-cache word,
    /// which the child shares); returns what [`leave`] restores (a vfork child may call
    /// `vfork` too: then the mark itself).
    extern "C" fn enter() -> u64 {
        stats::enter_vfork_child()
    }

    /// In the parent, once the child has left (or `vfork` failed): restores [`enter`]'s
    /// `saved`.
    extern "C" fn leave(saved: u64) {
        stats::leave_vfork_child(saved);
    }

    /// `vfork` failed with `code`: `errno`, and -1, as glibc's.
    extern "C" fn failed(code: c_int) -> pid_t {
        errno::set(code);
        -1
    }

    /// The exported `vfork` hook: glibc's `vfork` (x86-64 `vfork.S`) between [`enter`]
    /// and [`leave`]. The return address is popped before the system call and pushed
    /// again after it, so the child, which returns first and then uses the same stack,
    /// cannot overwrite the parent's. In the child, if a shadow stack is in use
    /// (`rdsspq` gives non-zero; it is a no-op without CET), it jumps back instead of
    /// returning, as glibc does, so the parent's shadow stack stays whole.
    ///
    /// # Safety
    /// The contract of libc's `vfork`: the child may only call `exec` or `_exit`
    /// (POSIX), or, as glibc allows, async-signal-safe functions before them.
    #[unsafe(naked)]
    #[no_mangle]
    pub unsafe extern "C" fn vfork() -> pid_t {
        std::arch::naked_asm!(
            "sub rsp, 8",
            "call {enter}",
            "add rsp, 8",
            // r8 survives the system call (only rax, rcx and r11 do not).
            "mov r8, rax",
            "pop rdi",
            "mov eax, {SYS_vfork}",
            "syscall",
            "push rdi",
            "test eax, eax",
            "jz 2f",
            // The parent, after the child left, or no child: restore (result kept).
            "push rax",
            "mov rdi, r8",
            "call {leave}",
            "pop rax",
            "cmp eax, -4095",
            "jae 3f",
            "ret",
            // The child.
            "2:",
            "xor esi, esi",
            "rdsspq rsi",
            "test rsi, rsi",
            "jz 4f",
            "pop rdi",
            "jmp rdi",
            "4:",
            "ret",
            // -errno.
            "3:",
            "neg eax",
            "mov edi, eax",
            "jmp {failed}",
            enter = sym enter,
            leave = sym leave,
            failed = sym failed,
            SYS_vfork = const libc::SYS_vfork,
        )
    }

    /// The exported `__vfork` hook (glibc's other name for it).
    ///
    /// # Safety
    /// As for [`vfork`].
    #[unsafe(naked)]
    #[no_mangle]
    pub unsafe extern "C" fn __vfork() -> pid_t {
        std::arch::naked_asm!("jmp {vfork}", vfork = sym vfork)
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    /// Whether the calling thread is a vfork child: not known here (module docs).
    #[inline(always)]
    pub(crate) fn in_child() -> bool {
        false
    }
}

pub(crate) use imp::in_child;
