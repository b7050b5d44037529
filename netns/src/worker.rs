//! Doing netlink work inside a network namespace.
//!
//! `setns` changes the calling thread only, so each call gets its own OS thread that enters
//! the namespace, opens a netlink connection there (sockets belong to the namespace they
//! were created in) and runs the work on a current-thread runtime. Nothing holds the
//! namespace across an `.await` of the caller.

use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};

use crate::Error;

/// Runs `work` inside the network namespace at `path` and returns its result.
pub fn in_netns<T, F, Fut>(path: &Path, work: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce(rtnetlink::Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, Error>>,
{
    let path: PathBuf = path.to_owned();
    let thread = std::thread::Builder::new()
        .name("vmlet-netns".into())
        .spawn(move || {
            let enter_error = |source| Error::Enter {
                path: path.clone(),
                source,
            };
            let ns = File::open(&path).map_err(enter_error)?;
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| enter_error(e.into()))?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Worker(e.to_string()))?;
            runtime.block_on(async move {
                let (connection, handle, _) = rtnetlink::new_connection()
                    .map_err(|e| Error::netlink("open netlink socket", e))?;
                let task = tokio::spawn(connection);
                let result = work(handle).await;
                task.abort();
                result
            })
        })
        .map_err(|e| Error::Worker(e.to_string()))?;
    thread
        .join()
        .map_err(|_| Error::Worker("the namespace thread panicked".into()))?
}
