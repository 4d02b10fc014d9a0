//! The real libc functions behind the hooks, resolved once, eagerly, when the library
//! loads (`dlsym` allocates: resolving lazily inside a hook deadlocks programs whose
//! allocator is initialising, e.g. jemalloc calling `mmap`).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// One real function: its symbol name and, once resolved, its address.
pub struct Real {
    name: &'static CStr,
    /// The symbol version to resolve (a compatibility version, for the hook that old
    /// programs bind to: see `hooks.rs`, "Versioned entry points"); `None` is the
    /// default version.
    version: Option<&'static CStr>,
    /// The real function once resolved; until then `unresolved`.
    address: AtomicPtr<c_void>,
    /// What `address` holds until the symbol is resolved: a function with the real
    /// one's signature that resolves it first (so a hook can always jump to
    /// `address`, with no check), or null.
    unresolved: AtomicPtr<c_void>,
}

impl Real {
    /// An unresolved entry for `name`.
    pub const fn new(name: &'static CStr) -> Real {
        Real::with_fallback(name, std::ptr::null_mut())
    }

    /// An unresolved entry for `name` whose [`Real::entry`] is `unresolved` until the
    /// symbol is resolved.
    pub const fn with_fallback(name: &'static CStr, unresolved: *mut c_void) -> Real {
        Real {
            name,
            version: None,
            address: AtomicPtr::new(unresolved),
            unresolved: AtomicPtr::new(unresolved),
        }
    }

    /// An unresolved entry for `name` at symbol version `version` (not the default).
    pub const fn versioned(name: &'static CStr, version: &'static CStr) -> Real {
        Real {
            version: Some(version),
            ..Real::new(name)
        }
    }

    /// The real function's address. Resolves on first use if the hook was called
    /// before the library's constructor ran; `None` if libc lacks the symbol.
    #[inline]
    pub fn address(&self) -> Option<*mut c_void> {
        self.resolved().or_else(|| self.resolve())
    }

    /// The address if already resolved; never calls `dlsym`.
    #[inline]
    pub fn resolved(&self) -> Option<*mut c_void> {
        let address = self.address.load(Ordering::Relaxed);
        (address != self.unresolved.load(Ordering::Relaxed)).then_some(address)
    }

    /// What a hook calls: the real function, or the fallback given to
    /// [`Real::with_fallback`] until it is resolved (one load, no branch).
    #[inline(always)]
    pub fn entry(&self) -> *mut c_void {
        self.address.load(Ordering::Relaxed)
    }

    /// Looks the symbol up in the objects loaded after this one (normally libc).
    pub fn resolve(&self) -> Option<*mut c_void> {
        let mut address = match self.version {
            // SAFETY: name and version are NUL-terminated; RTLD_NEXT skips our own
            // definitions.
            Some(version) => unsafe {
                libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr(), version.as_ptr())
            },
            // SAFETY: name is NUL-terminated; RTLD_NEXT skips our own definitions.
            None => unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) },
        };
        if address.is_null() {
            // Compatibility-only symbols (`__xstat` since glibc 2.33) have no default
            // version and are found only by naming the base version.
            // SAFETY: name and version are NUL-terminated C string constants;
            // RTLD_NEXT skips our own definitions.
            address =
                unsafe { libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr(), BASE_VERSION.as_ptr()) };
        }
        if address.is_null() {
            return None;
        }
        self.address.store(address, Ordering::Relaxed);
        Some(address)
    }
}

#[cfg(target_arch = "x86_64")]
const BASE_VERSION: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const BASE_VERSION: &CStr = c"GLIBC_2.17";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const BASE_VERSION: &CStr = c"GLIBC_2.0";

/// What a hook returns when libc has no real function to call (never happens for a
/// symbol a program could have linked against; kept so no path can crash).
pub trait Unavailable {
    /// The value signalling failure for this return type.
    fn unavailable() -> Self;
}

macro_rules! unavailable_int {
    ($($t:ty),*) => {$(
        impl Unavailable for $t {
            fn unavailable() -> Self {
                crate::errno::set(libc::ENOSYS);
                (0 as $t).wrapping_sub(1)
            }
        }
    )*};
}
unavailable_int!(i32, isize);

impl Unavailable for usize {
    fn unavailable() -> Self {
        crate::errno::set(libc::ENOSYS);
        0
    }
}

impl<T> Unavailable for *mut T {
    fn unavailable() -> Self {
        crate::errno::set(libc::ENOSYS);
        std::ptr::null_mut()
    }
}

impl Unavailable for () {
    fn unavailable() -> Self {}
}
