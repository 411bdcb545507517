//! One question to the plan source per customer at a time: requests that
//! miss the cache while the source is being asked about the same customer
//! wait for that answer instead of asking again (a source that hangs or
//! fails would otherwise be asked by every request of a hot customer in
//! each deadline).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

use crate::plan_source::Answer;
use crate::subject::Subject;

/// The questions in flight, by customer.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    flying: Mutex<HashMap<Subject, watch::Receiver<Option<Answer>>, foldhash::fast::RandomState>>,
}

/// A request's part in a question about its customer.
pub(crate) enum Seat<'a> {
    /// It asks: no question about the customer was in flight.
    Asks(Flight<'a>),
    /// Another request asks: its answer comes here (`None` until then;
    /// the sender goes away if that request is dropped before answering).
    Waits(watch::Receiver<Option<Answer>>),
}

/// The question one request asks: while it lives, others wait for it.
pub(crate) struct Flight<'a> {
    flights: &'a Flights,
    customer: Subject,
    answer: watch::Sender<Option<Answer>>,
}

impl Flights {
    fn flying(
        &self,
    ) -> MutexGuard<
        '_,
        HashMap<Subject, watch::Receiver<Option<Answer>>, foldhash::fast::RandomState>,
    > {
        self.flying.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ask about `customer`, or wait for the request already asking.
    pub(crate) fn board(&self, customer: &Subject) -> Seat<'_> {
        let mut flying = self.flying();
        if let Some(waiting) = flying.get(customer) {
            return Seat::Waits(waiting.clone());
        }
        let (answer, waiting) = watch::channel(None);
        flying.insert(customer.clone(), waiting);
        Seat::Asks(Flight {
            flights: self,
            customer: customer.clone(),
            answer,
        })
    }
}

impl Flight<'_> {
    /// Tell the waiting requests the answer (kept in the cache before: a
    /// request that comes once the question is over finds it there).
    pub(crate) fn land(self, answer: Answer) {
        // Every receiver may be gone: nobody was waiting.
        let _ = self.answer.send(Some(answer));
    }
}

impl Drop for Flight<'_> {
    /// The question is over, answered or not (its request was dropped):
    /// the next miss asks again.
    fn drop(&mut self) {
        self.flights.flying().remove(&self.customer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second request waits for the first; once it lands the next asks.
    #[test]
    fn one_asks_the_others_wait() {
        let flights = Flights::default();
        let customer = Subject::new("key-1").unwrap();
        let Seat::Asks(flight) = flights.board(&customer) else {
            panic!("nobody was asking");
        };
        let Seat::Waits(waiting) = flights.board(&customer) else {
            panic!("the first is asking");
        };
        assert!(matches!(
            flights.board(&Subject::new("key-2").unwrap()),
            Seat::Asks(_)
        ));
        flight.land(Answer::Default);
        assert_eq!(*waiting.borrow(), Some(Answer::Default));
        assert!(
            matches!(flights.board(&customer), Seat::Asks(_)),
            "landed: over"
        );
    }

    /// A request dropped while asking leaves no question behind: the
    /// waiting ones see its sender go, and the next request asks.
    #[test]
    fn a_dropped_question_is_over() {
        let flights = Flights::default();
        let customer = Subject::new("key-1").unwrap();
        let asking = flights.board(&customer);
        let Seat::Waits(waiting) = flights.board(&customer) else {
            panic!("the first is asking");
        };
        drop(asking);
        assert!(waiting.has_changed().is_err(), "the sender is gone");
        assert!(matches!(flights.board(&customer), Seat::Asks(_)));
    }
}
