use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// Manages a collection of threads.
///
/// A new thread is created every time all the existing threads are full.
/// Any idle thread will automatically die after a few seconds.
pub struct TaskPool {
    sharing: Arc<Sharing>,
}

struct Sharing {
    // list of the tasks to be done by worker threads
    todo: Mutex<VecDeque<Box<dyn FnMut() + Send>>>,

    // condvar that will be notified whenever a task is added to `todo`
    condvar: Condvar,

    // number of total worker threads running
    active_tasks: AtomicUsize,

    // number of idle worker threads
    waiting_tasks: AtomicUsize,

    // threads kept waiting for tasks however long they wait (patched for hive)
    min_threads: usize,

    // the stack size of each thread, when not the default (patched for hive)
    stack: Option<usize>,

    // the name of each thread (patched for hive)
    name: String,
}

/// Minimum number of active threads of [`TaskPool::new`].
static MIN_THREADS: usize = 4;

/// How long a thread beyond the minimum waits for another task before it ends.
const LINGER: Duration = Duration::from_millis(5000);

struct Registration<'a> {
    nb: &'a AtomicUsize,
}

impl<'a> Registration<'a> {
    fn new(nb: &'a AtomicUsize) -> Registration<'a> {
        nb.fetch_add(1, Ordering::Release);
        Registration { nb }
    }
}

impl<'a> Drop for Registration<'a> {
    fn drop(&mut self) {
        self.nb.fetch_sub(1, Ordering::Release);
    }
}

impl TaskPool {
    pub fn new() -> TaskPool {
        TaskPool::with(MIN_THREADS, None, "http-conn".into())
    }

    /// A pool that keeps `min_threads` threads waiting and starts its threads
    /// with `stack` bytes of stack (patched in for hive: a pool of none keeps
    /// a thread only while it has a task, and `LINGER` after), named `name`.
    pub fn with(min_threads: usize, stack: Option<usize>, name: String) -> TaskPool {
        let pool = TaskPool {
            sharing: Arc::new(Sharing {
                todo: Mutex::new(VecDeque::new()),
                condvar: Condvar::new(),
                active_tasks: AtomicUsize::new(0),
                waiting_tasks: AtomicUsize::new(0),
                min_threads,
                stack,
                name,
            }),
        };

        for _ in 0..min_threads {
            pool.add_thread(None)
        }

        pool
    }

    /// Executes a function in a thread.
    /// If no thread is available, spawns a new one.
    pub fn spawn(&self, code: Box<dyn FnMut() + Send>) {
        let mut queue = self.sharing.todo.lock().unwrap();

        // Each waiting thread takes one queued task; a task beyond them gets a
        // thread of its own. (Upstream compared the waiting count with zero,
        // so a burst of connections queued behind threads that were notified
        // but had not woken yet, and behind long-lived connections such as
        // live streams, those tasks waited for ever; patched for hive.)
        if self.sharing.waiting_tasks.load(Ordering::Acquire) <= queue.len() {
            self.add_thread(Some(code));
        } else {
            queue.push_back(code);
            self.sharing.condvar.notify_one();
        }
    }

    fn add_thread(&self, initial_fn: Option<Box<dyn FnMut() + Send>>) {
        let sharing = self.sharing.clone();

        // A thread that cannot be created (out of memory or threads) drops its
        // task, which closes that one connection, instead of panicking in the
        // accept thread with the queue locked (patched in for hive).
        let mut builder = thread::Builder::new().name(self.sharing.name.clone());
        if let Some(stack) = self.sharing.stack {
            builder = builder.stack_size(stack);
        }
        let spawned = builder.spawn(move || {
            let sharing = sharing;
            let _active_guard = Registration::new(&sharing.active_tasks);

            if let Some(mut f) = initial_fn {
                f();
            }

            loop {
                let mut task: Box<dyn FnMut() + Send> = {
                    let mut todo = sharing.todo.lock().unwrap();

                    let task;
                    loop {
                        if let Some(poped_task) = todo.pop_front() {
                            task = poped_task;
                            break;
                        }
                        let _waiting_guard = Registration::new(&sharing.waiting_tasks);

                        let received = if sharing.active_tasks.load(Ordering::Acquire)
                            <= sharing.min_threads
                        {
                            todo = sharing.condvar.wait(todo).unwrap();
                            true
                        } else {
                            let (new_lock, waitres) =
                                sharing.condvar.wait_timeout(todo, LINGER).unwrap();
                            todo = new_lock;
                            !waitres.timed_out()
                        };

                        if !received && todo.is_empty() {
                            return;
                        }
                    }

                    task
                };

                task();
            }
        });
        if let Err(e) = spawned {
            log::warn!(
                "cannot start a connection thread: {}; closing that connection",
                e
            );
        }
    }
}

impl Drop for TaskPool {
    fn drop(&mut self) {
        self.sharing
            .active_tasks
            .store(999_999_999, Ordering::Release);
        self.sharing.condvar.notify_all();
    }
}
