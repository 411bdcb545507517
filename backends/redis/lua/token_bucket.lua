-- Tollgate: token bucket (Rust reference: algorithms/src/token_bucket.rs).
--
-- This file defines the algorithm (`token_bucket`), its refund (`refund_token_bucket`,
-- see layered.lua's refund mode), its reward (`reward_token_bucket`) and
-- the charge an admitted state marks (`charge_token_bucket`). The store runs them through
-- layered.lua, which holds the KEYS/ARGV layout (one layer = one call of
-- `token_bucket`) and finds them by the algorithm's code (src/script.rs
-- generates its tables from the Rust list of built-ins).
--
--   token_bucket(capacity, refill, period_us, full_at, remainder, _, now, cost)
--
-- Layer ARGV: algorithm 1, cost, capacity, refill, period_us.
-- State: cells {full at µs, remainder}: tokens are scaled by period_us, so
--   refill scaled tokens accrue per µs; before `full_at` the bucket holds
--   full + remainder − (full_at − t) × refill, from it on it is full
--   (0 ≤ remainder < refill). Stored as one integer when the remainder is
--   0 (always, when refill divides period_us), else as "a b". nil: the key
--   holds no state (a new key starts full). No time besides is kept (see
--   the Rust reference on a clock that steps back).
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.

-- The scaled level at `now` (Rust: level_at).
local function token_bucket_level(full, refill, full_at, remainder, now)
  if not full_at or now >= full_at then
    return full
  end
  local until_full = full_at - now
  -- Compared first so the product stays below 2^53: this far from full
  -- the bucket is empty (a state written under other parameters).
  if until_full >= cdiv(full + remainder, refill) then
    return 0
  end
  local deficit = max(until_full * refill - remainder, 0)
  return full - min(deficit, full)
end

local function token_bucket(capacity, refill, period, full_at, remainder, _, now, cost)
  local full = capacity * period
  local level = token_bucket_level(full, refill, full_at, remainder, now)
  local need = cost * period
  if level >= need then
    local left = level - need
    -- left is below full (need is at least one period): full again after
    -- until_full >= 1 µs, so no after() or floor of 1 ms is needed.
    local deficit = full - left
    local until_full = cdiv(deficit, refill)
    return true, capacity, fdiv(left, period), until_full, -1,
      cdiv(until_full, 1000), now + until_full, until_full * refill - deficit, 0
  end
  return false, capacity, fdiv(level, period), cdiv(full - level, refill),
    cdiv(need - level, refill)
end

-- Token bucket: GCRA's refund in scaled tokens (Rust: token_bucket_refund).
-- The charge moved the instant the bucket is full again `cost × period`
-- scaled tokens later, to the mark it wrote (`mark_at`, with
-- `mark_remainder`); only what is still ahead of now is owed, and the
-- bucket never goes above full.
local function refund_token_bucket(capacity, refill, period, full_at, remainder, _, now, cost, mark_remainder, mark_at)
  if not full_at or mark_at <= now then
    return 0
  end
  local full = capacity * period
  local owed = cost * period
  local ahead_us = mark_at - now
  local ahead = owed
  -- Compared first so the product stays below 2^53.
  if ahead_us <= cdiv(full + mark_remainder, refill) then
    ahead = max(ahead_us * refill - mark_remainder, 0)
  end
  local level = token_bucket_level(full, refill, full_at, remainder, now)
  local give = min(owed, ahead, full - level)
  if give <= 0 then
    return 0
  end
  local left = level + give
  if left == full then
    return give, now, 0, 0
  end
  local until_full = cdiv(full - left, refill)
  return give, now + until_full, until_full * refill - (full - left), 0
end

-- A reward: the refund of a charge that never ages.
local function reward_token_bucket(capacity, refill, period, a, b, c, now, units)
  return refund_token_bucket(capacity, refill, period, a, b, c, now, units, 0, FAR)
end

-- The charge an admitted state marks (refund's `at` and `mark`): the
-- remainder and the full-again instant it wrote.
local function charge_token_bucket(full_at, remainder, _)
  return remainder, full_at
end
