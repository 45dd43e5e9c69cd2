//! Taking from a shared ring that is usually empty. Workers look at their
//! rings (posted work requests, STag changes, forwarded frames, control
//! messages) on every iteration of the loop, and the application polls
//! its completion queues as often; nearly every look finds nothing.
//!
//! `crossbeam`'s `pop` and `try_recv` answer "empty" only after a
//! sequentially consistent fence (`mfence` on x86: an empty `pop` takes
//! ~5.5 ns on this project's test machines, against ~0.5 ns for a look
//! at the head and the tail), which a worker looking at five or six
//! rings per iteration pays each time. Their `is_empty` reads the head
//! and the tail with sequentially consistent loads (plain loads on x86)
//! and no fence, so [`PollPop::poll_pop`] asks that first and pops only
//! when something is there. An element pushed just after the look is
//! found on the next look, as it would be after an empty `pop`; the
//! loads stay in the single total order of sequentially consistent
//! operations, so a worker that says it sleeps and then looks still meets
//! a poster that pushes and then looks for sleepers.

use crossbeam_channel::Receiver;
use crossbeam_queue::ArrayQueue;

/// `pop` that costs two loads when there is nothing to take.
pub(crate) trait PollPop<T> {
    /// The oldest element, if the ring holds one.
    fn poll_pop(&self) -> Option<T>;
}

impl<T> PollPop<T> for ArrayQueue<T> {
    #[inline]
    fn poll_pop(&self) -> Option<T> {
        if self.is_empty() {
            None
        } else {
            self.pop()
        }
    }
}

impl<T> PollPop<T> for Receiver<T> {
    #[inline]
    fn poll_pop(&self) -> Option<T> {
        if self.is_empty() {
            None
        } else {
            self.try_recv().ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_what_was_pushed_in_order_and_nothing_more() {
        let q = ArrayQueue::new(4);
        assert_eq!(q.poll_pop(), None::<u32>);
        q.push(1).unwrap();
        q.push(2).unwrap();
        assert_eq!(
            (q.poll_pop(), q.poll_pop(), q.poll_pop()),
            (Some(1), Some(2), None)
        );

        let (tx, rx) = crossbeam_channel::unbounded();
        assert_eq!(rx.poll_pop(), None::<u32>);
        tx.send(7).unwrap();
        tx.send(8).unwrap();
        assert_eq!(
            (rx.poll_pop(), rx.poll_pop(), rx.poll_pop()),
            (Some(7), Some(8), None)
        );
    }

    #[test]
    fn a_consumer_on_another_thread_takes_every_element_once_in_order() {
        let q = std::sync::Arc::new(ArrayQueue::new(8));
        let n = 100_000u64;
        let producer = {
            let q = q.clone();
            std::thread::spawn(move || {
                for i in 0..n {
                    let mut v = i;
                    while let Err(back) = q.push(v) {
                        v = back;
                        std::hint::spin_loop();
                    }
                }
            })
        };
        let mut next = 0;
        while next < n {
            if let Some(v) = q.poll_pop() {
                assert_eq!(v, next);
                next += 1;
            }
        }
        producer.join().unwrap();
        assert_eq!(q.poll_pop(), None);
    }
}
