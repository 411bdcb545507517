//! What an open key holds and how long it is, read through
//! `RedisModule_KeyType` and `RedisModule_ValueLength`: the module crate
//! has no wrapper for a key opened through `raw::open_key`, which the key
//! API's writes (`key_api.rs`) and the list reads (`list_log.rs`) use.

use redis_module::raw;

/// The two functions, as Redis set them when the module loaded.
#[derive(Clone, Copy)]
pub(crate) struct KeyShape {
    key_type: unsafe extern "C" fn(*mut raw::RedisModuleKey) -> i32,
    value_length: unsafe extern "C" fn(*mut raw::RedisModuleKey) -> usize,
}

impl KeyShape {
    /// The functions; `None` when this server's module API lacks one.
    pub(crate) fn get() -> Option<KeyShape> {
        // SAFETY: reading `static mut` function pointers that Redis set
        // once, when the module loaded (`RedisModule_Init`), before any
        // command ran; nothing writes them afterwards.
        #[allow(unsafe_code)]
        let (key_type, value_length) =
            unsafe { (raw::RedisModule_KeyType?, raw::RedisModule_ValueLength?) };
        Some(KeyShape {
            key_type,
            value_length,
        })
    }

    /// The length of the value at `handle` (a string's bytes, a list's
    /// items) when it is of `kind` (a `REDISMODULE_KEYTYPE_*`); `None`
    /// when it is of another kind. (A missing key is of kind
    /// `REDISMODULE_KEYTYPE_EMPTY`, length 0.)
    ///
    /// # Safety
    ///
    /// `handle` is a key opened on the running command's context and not
    /// closed yet (an empty key included: both functions take one).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn length_if(
        &self,
        handle: *mut raw::RedisModuleKey,
        kind: isize,
    ) -> Option<usize> {
        // SAFETY: the caller's promise above.
        let holds = unsafe { (self.key_type)(handle) } == kind as i32;
        // SAFETY: as above.
        holds.then(|| unsafe { (self.value_length)(handle) })
    }
}
