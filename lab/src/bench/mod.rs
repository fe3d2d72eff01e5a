//! Every bench of the lab, one module each; `strait-lab bench NAME` runs one.

pub mod admin_load;
pub mod churn;
pub mod control;
pub mod failover;
pub mod flood;
pub mod line;
pub mod maglev;
pub mod pipeline;
pub mod rules;
pub mod soak;
