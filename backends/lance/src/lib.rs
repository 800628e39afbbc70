//! ctxlog over a Lance dataset with MemWAL (work in progress).

use ctxlog_core::{Error, Result, StoreOptions};

pub struct LanceStore;

impl LanceStore {
    pub async fn open(uri: &str, _options: StoreOptions) -> Result<std::sync::Arc<dyn ctxlog_core::Store>> {
        Err(Error::BackendNotCompiled {
            uri: uri.to_string(),
            backend: "lance",
            feature: "lance",
        })
    }
}
