//! Redis' glob-style pattern matching (`stringmatchlen`): `*`, `?`, `[abc]`, `[^a-z]`, `\x`.

/// Most nested `*` backtracking steps before a pattern is declared not to match (bounds the work
/// of hostile patterns such as `*a*a*a*a*b`).
pub const GLOB_STEPS_MAX: usize = 1_000_000;

/// Most `*` nested in one match attempt (Redis' limit too): a pattern that needs more does not
/// match, and the recursion stays shallow.
pub const GLOB_NESTING_MAX: usize = 1000;

/// Whether `string` matches `pattern`.
pub fn matches(pattern: &[u8], string: &[u8]) -> bool {
    let mut steps = 0usize;
    match_at(pattern, string, &mut steps, 0)
}

fn match_at(mut p: &[u8], mut s: &[u8], steps: &mut usize, nesting: usize) -> bool {
    if nesting > GLOB_NESTING_MAX {
        *steps = GLOB_STEPS_MAX + 1; // the whole match fails, not only this branch
        return false;
    }
    while let Some(&c) = p.first() {
        *steps += 1;
        if *steps > GLOB_STEPS_MAX {
            return false;
        }
        match c {
            b'*' => {
                while p.len() > 1 && p[1] == b'*' {
                    p = &p[1..];
                }
                if p.len() == 1 {
                    return true;
                }
                for start in 0..=s.len() {
                    if match_at(&p[1..], &s[start..], steps, nesting + 1) {
                        return true;
                    }
                    if *steps > GLOB_STEPS_MAX {
                        return false;
                    }
                }
                return false;
            }
            b'?' => {
                if s.is_empty() {
                    return false;
                }
                s = &s[1..];
                p = &p[1..];
            }
            b'[' => {
                let Some((&ch, rest)) = s.split_first() else {
                    return false;
                };
                let (matched, after) = class(&p[1..], ch);
                if !matched {
                    return false;
                }
                p = after;
                s = rest;
            }
            _ => {
                let (lit, after) = if c == b'\\' && p.len() >= 2 {
                    (p[1], &p[2..])
                } else {
                    (c, &p[1..])
                };
                if s.first() != Some(&lit) {
                    return false;
                }
                s = &s[1..];
                p = after;
            }
        }
    }
    s.is_empty()
}

/// Matches `ch` against a class starting after `[`; returns the match and the pattern after `]`.
fn class(mut p: &[u8], ch: u8) -> (bool, &[u8]) {
    let negate = p.first() == Some(&b'^');
    if negate {
        p = &p[1..];
    }
    let mut matched = false;
    loop {
        match p {
            [] => break,
            [b']', rest @ ..] => {
                p = rest;
                break;
            }
            [b'\\', e, rest @ ..] => {
                matched |= *e == ch;
                p = rest;
            }
            [a, b'-', b, rest @ ..] if *b != b']' => {
                let (lo, hi) = if a <= b { (*a, *b) } else { (*b, *a) };
                matched |= lo <= ch && ch <= hi;
                p = rest;
            }
            [a, rest @ ..] => {
                matched |= *a == ch;
                p = rest;
            }
        }
    }
    (matched != negate, p)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn glob_cases() {
        assert!(matches(b"*", b""));
        assert!(matches(b"h?llo", b"hello"));
        assert!(matches(b"h*llo", b"heeeello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[ae]llo", b"hillo"));
        assert!(matches(b"h[^e]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-b]llo", b"hbllo"));
        assert!(matches(b"key:*", b"key:000001"));
        assert!(!matches(b"key:*", b"counter:1"));
        assert!(matches(b"a\\*b", b"a*b"));
        assert!(!matches(b"a\\*b", b"axb"));
        assert!(!matches(b"*a*a*a*a*a*a*a*a*a*b", &[b'a'; 64]));
        // Deeper than Redis' nesting limit: no match (as in Redis), and no deep recursion.
        let deep = b"*?".repeat(50_000);
        assert!(!matches(&deep, &[b'a'; 50_000]));
        let shallow = b"*?".repeat(super::GLOB_NESTING_MAX);
        assert!(matches(&shallow, &[b'a'; super::GLOB_NESTING_MAX]));
    }
}
