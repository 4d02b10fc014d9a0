//! Bounded JSON-lines reading for the stage socket and the admin socket: a line longer
//! than the limit is skipped whole (and reported), never buffered without bound.

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
}

/// Reads one line of at most `limit` bytes.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    limit: usize,
) -> std::io::Result<Line> {
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
            line.extend_from_slice(&chunk[..chunk.len().min(limit + 1 - line.len())]);
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
}
