//! The real libc functions behind the hooks, resolved once, eagerly, when the library
//! loads (`dlsym` allocates: resolving lazily inside a hook deadlocks programs whose
//! allocator is initialising, e.g. jemalloc calling `mmap`).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One real function: its symbol name and, once resolved, its address.
pub struct Real {
    name: &'static CStr,
    address: AtomicUsize,
}

impl Real {
    /// An unresolved entry for `name`.
    pub const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            address: AtomicUsize::new(0),
        }
    }

    /// The real function's address. Resolves on first use if the hook was called
    /// before the library's constructor ran; `None` if libc lacks the symbol.
    #[inline]
    pub fn address(&self) -> Option<*mut c_void> {
        match self.address.load(Ordering::Relaxed) {
            0 => self.resolve(),
            a => Some(a as *mut c_void),
        }
    }

    /// The address if already resolved; never calls `dlsym`.
    #[inline]
    pub fn resolved(&self) -> Option<*mut c_void> {
        match self.address.load(Ordering::Relaxed) {
            0 => None,
            a => Some(a as *mut c_void),
        }
    }

    /// Looks the symbol up in the objects loaded after this one (normally libc).
    pub fn resolve(&self) -> Option<*mut c_void> {
        // SAFETY: name is NUL-terminated; RTLD_NEXT skips our own definitions.
        let mut address = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) };
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
        self.address.store(address as usize, Ordering::Relaxed);
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
