//! The cases, one module per rule or group of rules, each listing its own cases.

pub mod as_of;
pub mod creation;
pub mod durability;
pub mod faults;
pub mod fencing;
pub mod forks;
pub mod history;
pub mod idempotency;
pub mod input;
pub mod maintenance;
pub mod order;
pub mod reading;
pub mod reclaim;
pub mod saved_search;
pub mod search;
pub mod snapshots;
pub mod summaries;

/// Every case, in the contract's order.
pub fn all() -> Vec<crate::Case> {
    [
        durability::cases(),
        reading::cases(),
        fencing::cases(),
        idempotency::cases(),
        order::cases(),
        history::cases(),
        input::cases(),
        creation::cases(),
        maintenance::cases(),
        reclaim::cases(),
        reclaim::retain_race_cases(),
        reclaim::purge_conflict_cases(),
        snapshots::cases(),
        summaries::cases(),
        as_of::cases(),
        forks::cases(),
        search::cases(),
        saved_search::cases(),
        faults::cases(),
    ]
    .concat()
}
