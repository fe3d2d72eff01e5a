//! The merged configuration kept in step with Kubernetes changes: the file's services, then
//! the Kubernetes ones in the list's order (by name), less those [`kubemodel::merge`] leaves out.
//!
//! A change of a few services edits the merged configuration in place (a binary search in
//! the sorted Kubernetes part per changed name), so the work is proportional to the change,
//! not to the number of services. A large change (the first list, a relist) or a list out
//! of order is merged from scratch. Either way the result is what a merge from scratch gives
//! (the core's tests and the simulation check it).

use std::sync::Arc;

use strait_config::model::{Config, Service};
use tracing::warn;

use crate::kubemodel;

/// Kubernetes changes up to this many (or an eighth of the services, when more) edit the
/// merged configuration in place; larger ones merge it from scratch, which then costs about
/// as much as the edits and needs no search.
pub const BULK: usize = 64;

/// What [`apply`] changed.
#[derive(Debug)]
pub struct Applied {
    /// The names of the merged configuration's services that were set or removed, sorted,
    /// once each.
    pub names: Vec<String>,
    /// Whether the configuration was merged from scratch.
    pub bulk: bool,
}

/// Brings `merged`, the merge of `file` with the previous Kubernetes list, in line with
/// `list`, the list after `changes`. Logs a warning for every changed Kubernetes service
/// the merge leaves out (its name or frontend is a file service's).
pub fn apply(
    merged: &mut Config,
    file: &Config,
    list: &[Arc<Service>],
    changes: &[kubemodel::Change],
) -> Applied {
    let edits: Vec<(&str, Option<&Service>)> = kubemodel::merge_changes(file, changes).collect();
    let mut names: Vec<String> = edits.iter().map(|(n, _)| (*n).to_owned()).collect();
    names.sort_unstable();
    names.dedup();
    let sorted = list.windows(2).all(|w| w[0].name < w[1].name);
    let bulk = !sorted || changes.len() > BULK.max(list.len() / 8);
    if bulk {
        let (whole, dropped) = kubemodel::merge(file, list);
        for d in dropped {
            warn!("{d}");
        }
        *merged = whole;
        return Applied { names, bulk };
    }
    // The warnings a merge from scratch gives for the changed services.
    let set: Vec<&Service> = changes.iter().filter_map(|(_, s)| s.as_deref()).collect();
    for d in kubemodel::dropped(file, &set) {
        warn!("{d}");
    }
    let file_len = file.services.len();
    for (name, s) in &edits {
        let at = merged.services[file_len..]
            .binary_search_by(|x| x.name.as_str().cmp(name))
            .map(|i| i + file_len)
            .map_err(|i| i + file_len);
        match (at, s) {
            (Ok(i), Some(s)) => merged.services[i] = (*s).clone(),
            (Err(i), Some(s)) => merged.services.insert(i, (*s).clone()),
            (Ok(i), None) => {
                merged.services.remove(i);
            }
            (Err(_), None) => {}
        }
    }
    Applied { names, bulk }
}

/// The service named `name` in a merged configuration whose first `file_len` services are
/// the file's and the rest Kubernetes services sorted by name.
pub fn find<'a>(cfg: &'a Config, file_len: usize, name: &str) -> Option<&'a Service> {
    let (file, kube) = cfg.services.split_at(file_len.min(cfg.services.len()));
    file.iter().find(|s| s.name == name).or_else(|| {
        kube.binary_search_by(|s| s.name.as_str().cmp(name))
            .map(|i| &kube[i])
            .ok()
            // A list out of order (merged from scratch, see `apply`).
            .or_else(|| kube.iter().find(|s| s.name == name))
    })
}
