//! Bounded JSON-lines reading for the stage socket and the admin socket: a line longer
//! than the limit is skipped whole (and reported), never buffered without bound.

use crate::bounds::Budget;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What the next line was.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line, without its newline.
    Text(String),
    /// A line longer than the limit, skipped; the stream is positioned after it.
    TooLong(usize),
    /// The peer closed the connection.
    End,
    /// Buffering more of this line would exceed a byte budget (too many partial lines
    /// pending on this node or for this user): the connection should be closed.
    OverBudget,
}

/// Bytes reserved in budgets, given back when dropped (also when the read is
/// cancelled, e.g. by a timeout).
struct Reserved<'a> {
    budgets: &'a [&'a Budget],
    bytes: usize,
}

impl Reserved<'_> {
    fn take(&mut self, bytes: usize) -> bool {
        for (i, budget) in self.budgets.iter().enumerate() {
            if !budget.take(bytes) {
                for earlier in &self.budgets[..i] {
                    earlier.give(bytes);
                }
                return false;
            }
        }
        self.bytes += bytes;
        true
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        for budget in self.budgets {
            budget.give(self.bytes);
        }
    }
}

/// Reads one line of at most `limit` bytes.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    limit: usize,
) -> std::io::Result<Line> {
    read_line_within(reader, limit, &[]).await
}

/// Reads one line of at most `limit` bytes, holding what it buffers of the line in
/// every one of `budgets` until it returns ([`Line::OverBudget`] if one is exhausted).
pub async fn read_line_within<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    limit: usize,
    budgets: &[&Budget],
) -> std::io::Result<Line> {
    let mut reserved = Reserved { budgets, bytes: 0 };
    let mut line = Vec::new();
    let mut total = 0usize;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if total == 0 {
                Line::End
            } else {
                finish(line, total, limit)
            });
        }
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (&available[..end], Some(end + 1)),
            None => (available, None),
        };
        total += chunk.len();
        if line.len() <= limit {
            let kept = &chunk[..chunk.len().min(limit + 1 - line.len())];
            if !budgets.is_empty() && !reserved.take(kept.len()) {
                return Ok(Line::OverBudget);
            }
            line.extend_from_slice(kept);
        }
        let consumed = done.unwrap_or(available.len());
        reader.consume(consumed);
        if done.is_some() {
            return Ok(finish(line, total, limit));
        }
    }
}

fn finish(line: Vec<u8>, total: usize, limit: usize) -> Line {
    if total > limit {
        Line::TooLong(total)
    } else {
        Line::Text(
            String::from_utf8_lossy(&line)
                .trim_end_matches('\r')
                .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    #[tokio::test]
    async fn lines_are_bounded() {
        let input = format!("short\n{}\nafter\nlast", "x".repeat(100));
        let mut reader = BufReader::with_capacity(8, input.as_bytes());
        assert_eq!(
            read_line(&mut reader, 10).await.unwrap(),
            Line::Text("short".into())
        );
        assert_eq!(
            read_line(&mut reader, 10).await.unwrap(),
            Line::TooLong(100)
        );
        assert_eq!(
            read_line(&mut reader, 10).await.unwrap(),
            Line::Text("after".into())
        );
        assert_eq!(
            read_line(&mut reader, 10).await.unwrap(),
            Line::Text("last".into())
        );
        assert_eq!(read_line(&mut reader, 10).await.unwrap(), Line::End);
    }

    #[tokio::test]
    async fn partial_lines_are_held_in_budgets() {
        let node = Budget::new(100);
        let user = Budget::new(20);
        let input = format!("{}\nshort\n", "x".repeat(50));
        let mut reader = BufReader::with_capacity(8, input.as_bytes());
        assert_eq!(
            read_line_within(&mut reader, 1000, &[&node, &user])
                .await
                .unwrap(),
            Line::OverBudget
        );
        assert_eq!((node.used(), user.used()), (0, 0));
        let mut reader = BufReader::with_capacity(8, "short\n".as_bytes());
        assert_eq!(
            read_line_within(&mut reader, 1000, &[&node, &user])
                .await
                .unwrap(),
            Line::Text("short".into())
        );
        assert_eq!((node.used(), user.used()), (0, 0));
    }
}
