//! The hive-wide limit on `claude` processes at once (issue 42, the fleet
//! file's `max_claude`): a harness runs a `claude` for the message
//! `recv_next` hands it, so handing out a message takes one of `max_claude`
//! slots, and 1000 boot kicks do not start 1000 `claude` together (the real
//! CLI takes ~300 MB each). An agent with something to hand out and no slot
//! waits in one line, first come first served: its `recv_next` parks, and
//! it is woken when a slot is its. The slot is given back when the turn
//! ends — `ack_turn`, `requeue_inflight`, `dead_letter` — or when the
//! agent's harness has no connection left (a crashed harness never keeps
//! one); a broker pause takes the agent out of the line. The limit is read
//! from the fleet as the hub has it, so `hive reload` applies it at once
//! (a raised limit wakes whoever it lets in). The slots are the hub's, in
//! memory: a restarted broker starts with every slot free, and the
//! harnesses' next `recv_next`s take them again.
//!
//! Not gated: what a harness runs outside a handed-out message (a
//! checkpoint or `/compact` after a run, a continue after a pause); each
//! follows a turn of its own agent, so the limit is exceeded by at most
//! those follow-ups, never by a burst of mail.

use super::Hub;
use std::collections::{BTreeSet, VecDeque};

/// Who holds a slot, and who waits for one, in order.
#[derive(Debug, Default)]
pub(super) struct Slots {
    holders: BTreeSet<String>,
    line: VecDeque<String>,
}

impl Slots {
    /// Whether `agent` holds a slot.
    pub(super) fn holds(&self, agent: &str) -> bool {
        self.holders.contains(agent)
    }

    /// Whether `agent` waits in line for a slot.
    #[cfg(test)]
    pub(super) fn waits(&self, agent: &str) -> bool {
        self.line.iter().any(|a| a == agent)
    }

    /// How many slots are taken.
    pub(super) fn taken(&self) -> usize {
        self.holders.len()
    }

    /// Whether `agent` would get a slot of `max` now: it holds one, or one
    /// is free and nobody in line comes before it.
    pub(super) fn free_for(&self, agent: &str, max: usize) -> bool {
        if self.holds(agent) {
            return true;
        }
        let free = max.saturating_sub(self.holders.len());
        let place = self.line.iter().position(|a| a == agent);
        place.unwrap_or(self.line.len()) < free
    }

    /// `agent` wants a slot of `max`: true when it holds one now (it had
    /// one, or a free one was its turn); else it waits in line (at its
    /// place, or at the end when it was not in line).
    pub(super) fn take(&mut self, agent: &str, max: usize) -> bool {
        if self.holds(agent) {
            return true;
        }
        let free = max.saturating_sub(self.holders.len());
        let place = self.line.iter().position(|a| a == agent);
        if place.unwrap_or(self.line.len()) < free {
            if let Some(i) = place {
                self.line.remove(i);
            }
            self.holders.insert(agent.to_string());
            return true;
        }
        if place.is_none() {
            self.line.push_back(agent.to_string());
        }
        false
    }

    /// `agent` gives its slot back, if it held one: the agents in line
    /// whose turn it is now (to be woken).
    pub(super) fn give_back(&mut self, agent: &str, max: usize) -> Vec<String> {
        if !self.holders.remove(agent) {
            return Vec::new();
        }
        self.admitted(max)
    }

    /// `agent` gives its slot back and leaves the line (its harness is
    /// gone, or the broker pauses it): the agents whose turn it is now.
    pub(super) fn leave(&mut self, agent: &str, max: usize) -> Vec<String> {
        let held = self.holders.remove(agent);
        let before = self.line.len();
        self.line.retain(|a| a != agent);
        if held || self.line.len() != before {
            self.admitted(max)
        } else {
            Vec::new()
        }
    }

    /// The agents in line that a free slot awaits.
    pub(super) fn admitted(&self, max: usize) -> Vec<String> {
        let free = max.saturating_sub(self.holders.len());
        self.line.iter().take(free).cloned().collect()
    }
}

impl Hub<'_> {
    /// The limit now: the fleet's `max_claude`, or its default.
    fn max_claude(&self) -> usize {
        self.cfg.max_claude() as usize
    }

    /// Whether `recv_next` may hand `agent` a message now: it holds a slot,
    /// takes a free one that is its turn (given back by [`Hub::slot_unused`]
    /// when nothing is handed out), or has nothing to hand out (then it needs
    /// none). False: it waits in line.
    pub(super) fn slot_for_turn(&mut self, agent: &str) -> Result<bool, String> {
        let max = self.max_claude();
        // The usual case costs no query: a slot is its (it is given back
        // when nothing is handed out).
        if self.slots.free_for(agent, max) {
            return Ok(self.slots.take(agent, max));
        }
        let work = self.transient_inflight.contains_key(agent)
            || self.unread(agent)? > 0
            || self.inflight_id(agent)?.is_some();
        if !work {
            return Ok(true);
        }
        let took = self.slots.take(agent, max);
        if !took {
            log::debug!(
                "{agent} waits for a claude slot ({} of {max} taken)",
                self.slots.taken()
            );
        }
        Ok(took)
    }

    /// `recv_next` took a slot for `agent` but had nothing to hand out.
    pub(super) fn slot_unused(&mut self, agent: &str) {
        let max = self.max_claude();
        let next = self.slots.give_back(agent, max);
        self.wake_admitted(next);
    }

    /// `agent`'s turn ended (acked, requeued, dead-lettered): its slot is
    /// free for the next in line.
    pub(super) fn slot_done(&mut self, agent: &str) {
        let max = self.max_claude();
        let next = self.slots.give_back(agent, max);
        self.wake_admitted(next);
    }

    /// `agent`'s harness is gone (or the broker pauses it): its slot, and
    /// its place in line, are the next ones'.
    pub(super) fn slot_left(&mut self, agent: &str) {
        let max = self.max_claude();
        let next = self.slots.leave(agent, max);
        self.wake_admitted(next);
    }

    /// The fleet changed (`hive reload`): a raised limit lets the next in
    /// line in now.
    pub(super) fn slots_resized(&mut self) {
        let next = self.slots.admitted(self.max_claude());
        self.wake_admitted(next);
    }

    fn wake_admitted(&mut self, agents: Vec<String>) {
        for a in agents {
            self.notify(&a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Slots;

    #[test]
    fn slots_are_taken_first_come_first_served_and_given_back() {
        let mut s = Slots::default();
        assert!(s.take("a", 2));
        assert!(s.take("b", 2));
        assert!(s.take("a", 2), "a holds one already");
        assert!(!s.free_for("c", 2));
        assert!(!s.take("c", 2));
        assert!(!s.take("d", 2));
        assert!(!s.take("d", 2), "asking again keeps its place");
        assert!(s.waits("c") && s.waits("d"));
        // A slot given back is c's (first in line), not d's.
        assert_eq!(s.give_back("a", 2), ["c"]);
        assert!(s.free_for("c", 2) && !s.free_for("d", 2));
        assert!(!s.take("d", 2), "d is behind c");
        assert!(s.take("c", 2));
        assert!(!s.waits("c"));
        assert_eq!(s.taken(), 2);
        // Nothing held: nothing given back, nobody woken.
        assert!(s.give_back("a", 2).is_empty());
        // A harness gone gives its slot back and d's turn comes.
        assert_eq!(s.leave("b", 2), ["d"]);
        // A newcomer does not pass d.
        assert!(!s.take("e", 2));
        assert!(s.take("d", 2));
        // One waiting leaves the line: no slot is freed.
        assert!(s.leave("e", 2).is_empty());
        assert!(!s.waits("e"));
    }

    #[test]
    fn a_raised_limit_admits_the_next_in_line() {
        let mut s = Slots::default();
        assert!(s.take("a", 1));
        assert!(!s.take("b", 1));
        assert!(!s.take("c", 1));
        assert!(s.admitted(1).is_empty());
        assert_eq!(s.admitted(3), ["b", "c"]);
        assert!(s.take("c", 3), "c's turn with three slots");
        assert!(s.take("b", 3));
        // A lowered limit takes no slot away; nobody new gets one.
        assert!(!s.take("d", 1));
        assert!(s.give_back("a", 1).is_empty());
        assert!(s.give_back("b", 1).is_empty());
        assert_eq!(s.give_back("c", 1), ["d"]);
    }
}
