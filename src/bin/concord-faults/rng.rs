//! A small seeded generator (SplitMix64): every schedule and workload choice comes from the
//! run's seed, so a failing run can be replayed.

/// SplitMix64: fast, good enough for test schedules, and identical on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi.saturating_sub(lo) + 1)
    }

    /// A child generator for an independent stream of choices.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_choices() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<usize> = (0..20).map(|_| a.below(100)).collect();
        let ys: Vec<usize> = (0..20).map(|_| b.below(100)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().any(|x| *x != xs[0]), "choices vary");
    }
}
