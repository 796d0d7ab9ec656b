use std::io::Result as IoResult;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::unix::io::{AsRawFd, RawFd};

use crate::connection::Connection;

pub(crate) struct Stream(Connection);

impl From<Connection> for Stream {
    fn from(tcp_stream: Connection) -> Self {
        Stream(tcp_stream)
    }
}

impl Stream {
    /// A second handle on the socket; fails (instead of panicking) when no
    /// descriptor is left, so the accept loop can back off.
    fn try_clone(&self) -> IoResult<Stream> {
        Ok(Stream(self.0.try_clone()?))
    }

    fn peer_addr(&mut self) -> IoResult<Option<SocketAddr>> {
        self.0.peer_addr()
    }

    fn shutdown(&mut self, how: Shutdown) -> IoResult<()> {
        self.0.shutdown(how)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> IoResult<usize> {
        self.0.read(buf)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> IoResult<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> IoResult<()> {
        self.0.flush()
    }
}

pub struct RefinedTcpStream {
    stream: Stream,
    close_read: bool,
    close_write: bool,
}

impl RefinedTcpStream {
    /// The reading and the writing half of one connection (two descriptors).
    pub(crate) fn new<S>(stream: S) -> IoResult<(RefinedTcpStream, RefinedTcpStream)>
    where
        S: Into<Stream>,
    {
        let stream: Stream = stream.into();

        let (read, write) = (stream.try_clone()?, stream);

        let read = RefinedTcpStream {
            stream: read,
            close_read: true,
            close_write: false,
        };

        let write = RefinedTcpStream {
            stream: write,
            close_read: false,
            close_write: true,
        };

        Ok((read, write))
    }

    /// Returns true if this struct wraps around a secure connection.
    #[inline]
    pub(crate) fn secure(&self) -> bool {
        false
    }

    pub(crate) fn peer_addr(&mut self) -> IoResult<Option<SocketAddr>> {
        self.stream.peer_addr()
    }
}

impl AsRawFd for RefinedTcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.0.as_raw_fd()
    }
}

impl Drop for RefinedTcpStream {
    fn drop(&mut self) {
        if self.close_read {
            self.stream.shutdown(Shutdown::Read).ok();
        }

        if self.close_write {
            self.stream.shutdown(Shutdown::Write).ok();
        }
    }
}

impl Read for RefinedTcpStream {
    fn read(&mut self, buf: &mut [u8]) -> IoResult<usize> {
        self.stream.read(buf)
    }
}

impl Write for RefinedTcpStream {
    fn write(&mut self, buf: &[u8]) -> IoResult<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> IoResult<()> {
        self.stream.flush()
    }
}
