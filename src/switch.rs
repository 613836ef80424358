//! Process-wide on/off switches for the device fast paths, read once from the environment.
//!
//! Each fast path that replaces a generic computation on a GPU (cuDNN for the models, the
//! per-pair loss kernels) has one, so that the same binary can run the generic path for a
//! side-by-side measurement or as a fallback, without a rebuild.

use std::sync::atomic::{AtomicU8, Ordering};

/// A switch that is on unless its environment variable says `0`, `off` or `false`, or
/// [`EnvSwitch::set`] turned it off.
#[derive(Debug)]
pub struct EnvSwitch {
    var: &'static str,
    /// 0: the environment not read yet, 1: on, 2: off.
    state: AtomicU8,
}

impl EnvSwitch {
    /// A switch read from `var` on its first use.
    pub const fn new(var: &'static str) -> Self {
        EnvSwitch {
            var,
            state: AtomicU8::new(0),
        }
    }

    /// Whether the switch is on.
    pub fn on(&self) -> bool {
        match self.state.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let off = std::env::var(self.var)
                    .map(|v| matches!(v.trim(), "0" | "off" | "false"))
                    .unwrap_or(false);
                // A concurrent `set` wins over the environment.
                let _ = self.state.compare_exchange(
                    0,
                    if off { 2 } else { 1 },
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                self.state.load(Ordering::Relaxed) == 1
            }
        }
    }

    /// Turns the switch on or off for the whole process.
    pub fn set(&self, on: bool) {
        self.state.store(if on { 1 } else { 2 }, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_turns_a_switch_off_and_set_overrides_it() {
        // A variable name of this test only, so no other test sees it.
        std::env::set_var("RANKWISE_SWITCH_TEST_A", "off");
        let s = EnvSwitch::new("RANKWISE_SWITCH_TEST_A");
        assert!(!s.on());
        s.set(true);
        assert!(s.on());
        let unset = EnvSwitch::new("RANKWISE_SWITCH_TEST_UNSET");
        assert!(unset.on());
        unset.set(false);
        assert!(!unset.on());
    }
}
