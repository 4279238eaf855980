//! The interpreter's model of an epilogue's staging buffers and the TMA stores that
//! read them (`Stmt::TmaStore`), with the rules a GPU would not check.
//!
//! A TMA store reads shared memory through the async proxy, asynchronously: it may
//! read an element only if the thread that wrote it fenced (`fence.proxy.async`)
//! after the write and, unless it is the storing thread itself, a barrier both passed
//! came after that fence. An element a store read may be written again only by a
//! thread that knows the store has read it: its own thread after a
//! `cp.async.bulk.wait_group.read` that retires it, or any thread after a barrier that
//! came after that wait. A block may exit only once each thread's stores have read
//! their buffers (the buffers die with the block).

use thiserror::Error;

/// A staging rule broken.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum StagingError {
    #[error("thread {thread}: staged element {index} outside the {len} staging elements")]
    OutOfBounds {
        thread: usize,
        index: i64,
        len: usize,
    },
    #[error("thread {thread}: a TMA store reads staged element {index}, which no thread wrote")]
    Unwritten { thread: usize, index: i64 },
    #[error(
        "thread {thread}: a TMA store reads staged element {index}, which thread {writer} wrote without a fence.proxy.async and a barrier after it"
    )]
    Unpublished {
        thread: usize,
        index: i64,
        writer: usize,
    },
    #[error(
        "thread {thread}: staged element {index} written while thread {storer}'s TMA store may still read it (missing wait_group.read, or a barrier after it)"
    )]
    Race {
        thread: usize,
        index: i64,
        storer: usize,
    },
    #[error(
        "thread {thread}: exits while {pending} of its TMA stores may still read shared memory"
    )]
    Unwaited { thread: usize, pending: u64 },
}

/// One staged element.
#[derive(Debug, Clone, Copy, Default)]
struct Element {
    value: f32,
    /// Its writer and the write's sequence number.
    written: Option<(usize, u64)>,
    /// The TMA store that last read it: its thread and the thread's store number.
    read_by: Option<(usize, u64)>,
}

/// The staging buffers of one block (or cluster) and its threads' TMA stores.
pub struct Staging {
    elements: Vec<Element>,
    /// Per thread: barriers passed, and (sequence number, barriers passed) at its last
    /// fence.
    barriers: Vec<u64>,
    fenced: Vec<Option<(u64, u64)>>,
    /// Per thread: TMA stores issued, and per storing thread how many of its stores it
    /// knows to have read their buffers.
    issued: Vec<u64>,
    known: Vec<Vec<u64>>,
    sequence: u64,
}

impl Staging {
    pub fn new(elements: usize, threads: usize) -> Staging {
        Staging {
            elements: vec![Element::default(); elements],
            barriers: vec![0; threads],
            fenced: vec![None; threads],
            issued: vec![0; threads],
            known: vec![vec![0; threads]; threads],
            sequence: 0,
        }
    }

    fn slot(&self, thread: usize, index: i64) -> Result<usize, StagingError> {
        usize::try_from(index)
            .ok()
            .filter(|&i| i < self.elements.len())
            .ok_or(StagingError::OutOfBounds {
                thread,
                index,
                len: self.elements.len(),
            })
    }

    /// Thread `thread` writes `value` to element `index`.
    pub fn write(&mut self, thread: usize, index: i64, value: f32) -> Result<(), StagingError> {
        let i = self.slot(thread, index)?;
        if let Some((storer, store)) = self.elements[i].read_by
            && self.known[thread][storer] <= store
        {
            return Err(StagingError::Race {
                thread,
                index,
                storer,
            });
        }
        self.sequence += 1;
        self.elements[i] = Element {
            value,
            written: Some((thread, self.sequence)),
            read_by: None,
        };
        Ok(())
    }

    /// `fence.proxy.async` by `thread`.
    pub fn fence(&mut self, thread: usize) {
        self.fenced[thread] = Some((self.sequence, self.barriers[thread]));
    }

    /// A barrier of `members`: each passes it, and each learns what any of them knew
    /// of the stores that have read their buffers.
    pub fn barrier(&mut self, members: &[usize]) {
        let Some(&first) = members.first() else {
            return;
        };
        let mut known = self.known[first].clone();
        for &m in members {
            for (k, &v) in known.iter_mut().zip(&self.known[m]) {
                *k = (*k).max(v);
            }
        }
        for &m in members {
            self.barriers[m] += 1;
            self.known[m].clone_from(&known);
        }
    }

    /// A TMA store of `thread` reads element `index` (the store is numbered by
    /// `commit`, after its reads).
    pub fn read(&mut self, thread: usize, index: i64) -> Result<f32, StagingError> {
        let i = self.slot(thread, index)?;
        let element = self.elements[i];
        let (writer, sequence) = element
            .written
            .ok_or(StagingError::Unwritten { thread, index })?;
        // The writer's fence came after its write, and unless the writer is the
        // storing thread, the store's thread passed a barrier after that fence.
        let published = self.fenced[writer].is_some_and(|(fenced, at)| {
            fenced >= sequence && (writer == thread || at < self.barriers[thread])
        });
        if !published {
            return Err(StagingError::Unpublished {
                thread,
                index,
                writer,
            });
        }
        self.elements[i].read_by = Some((thread, self.issued[thread]));
        Ok(element.value)
    }

    /// Ends `thread`'s TMA store: its reads form its next store.
    pub fn commit(&mut self, thread: usize) {
        self.issued[thread] += 1;
    }

    /// `cp.async.bulk.wait_group.read pending` by `thread`.
    pub fn wait(&mut self, thread: usize, pending: u32) {
        let done = self.issued[thread].saturating_sub(u64::from(pending));
        let known = &mut self.known[thread][thread];
        *known = (*known).max(done);
    }

    /// A thread whose stores may still read shared memory as the block exits.
    pub fn unwaited(&self) -> Result<(), StagingError> {
        match (0..self.issued.len()).find(|&t| self.known[t][t] < self.issued[t]) {
            Some(thread) => Err(StagingError::Unwaited {
                thread,
                pending: self.issued[thread] - self.known[thread][thread],
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads stage one element each; thread 0 stores both.
    fn staged(fence: bool, barrier: bool) -> Result<(), StagingError> {
        let mut s = Staging::new(2, 2);
        for t in 0..2 {
            s.write(t, t as i64, t as f32)?;
            if fence {
                s.fence(t);
            }
        }
        if barrier {
            s.barrier(&[0, 1]);
        }
        s.read(0, 0)?;
        s.read(0, 1)?;
        s.commit(0);
        s.wait(0, 0);
        s.unwaited()
    }

    #[test]
    fn a_store_reads_what_was_fenced_before_a_barrier() {
        assert_eq!(staged(true, true), Ok(()));
        assert!(matches!(
            staged(false, true),
            Err(StagingError::Unpublished { writer: 0, .. })
        ));
        assert!(matches!(
            staged(true, false),
            Err(StagingError::Unpublished { writer: 1, .. })
        ));
    }

    #[test]
    fn a_buffer_is_rewritten_only_once_its_store_has_read_it() {
        let mut s = Staging::new(1, 2);
        s.write(1, 0, 1.0).unwrap();
        s.fence(1);
        s.barrier(&[0, 1]);
        s.read(0, 0).unwrap();
        s.commit(0);
        // Thread 1 does not know that thread 0's store has read the element.
        assert!(matches!(
            s.write(1, 0, 2.0),
            Err(StagingError::Race { storer: 0, .. })
        ));
        // Nor does it after thread 0 waits, until a barrier tells it.
        s.wait(0, 0);
        assert!(s.write(1, 0, 2.0).is_err());
        s.barrier(&[0, 1]);
        assert_eq!(s.write(1, 0, 2.0), Ok(()));
    }

    #[test]
    fn a_block_exits_only_after_its_stores_have_read() {
        let mut s = Staging::new(1, 1);
        s.write(0, 0, 1.0).unwrap();
        s.fence(0);
        s.read(0, 0).unwrap();
        s.commit(0);
        s.wait(0, 1);
        assert_eq!(
            s.unwaited(),
            Err(StagingError::Unwaited {
                thread: 0,
                pending: 1
            })
        );
        s.wait(0, 0);
        assert_eq!(s.unwaited(), Ok(()));
    }
}
