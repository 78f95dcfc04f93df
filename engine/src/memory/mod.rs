//! The process's memory: its one owner ([`owner`]), the budget it serves
//! ([`budget`]), the read policy chosen from it ([`policy`]), each store's
//! record cache ([`cache`]), the windows of blocks loaded ahead of mode-3
//! gathers ([`window`]) and read counters ([`reads`]), and the host's
//! rank registry that splits a cgroup between processes ([`ranks`]).

pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod owner;
pub(crate) mod policy;
pub(crate) mod ranks;
pub(crate) mod reads;
pub(crate) mod window;
