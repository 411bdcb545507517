-- Tollgate: token bucket (Rust reference: algorithms/src/token_bucket.rs).
--
-- This file defines the algorithm (`token_bucket`), its refund (`refund_token_bucket`,
-- see layered.lua's refund mode), its reward (`reward_token_bucket`) and
-- the charge an admitted state marks (`charge_token_bucket`). The store runs them through
-- layered.lua, which holds the KEYS/ARGV layout (one layer = one call of
-- `token_bucket`) and finds them by the algorithm's code (src/script.rs
-- generates its tables from the Rust list of built-ins).
--
--   token_bucket(capacity, refill, period_us, full_at, remainder, rate, now, cost, keep)
--
-- Layer ARGV: algorithm 1 (+ KEEPS_UNITS: `keep`), cost, capacity, refill,
--   period_us.
-- State: cells {full at µs, remainder, rate}: tokens are scaled by
--   period_us, so refill scaled tokens accrue per µs; before `full_at` the
--   bucket holds full + remainder − (full_at − t) × refill, from it on it
--   is full (0 ≤ remainder < refill). When the layer keeps units across a
--   change of plan (`keep`), `rate` records the rate it was written at
--   (refill × 2^40 + period_us), else 0. Stored as one integer when the
--   other cells are 0 (always, when refill divides period_us and the rate
--   is not recorded), else as "a b" or "a b c". nil: the key holds no
--   state (a new key starts full). No time besides is kept (see the Rust
--   reference on a clock that steps back).
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.

local RATE_PERIOD = 2 ^ 40

-- What a layer that keeps units records: its rate (Rust: recorded_rate).
local function token_bucket_rate(refill, period, keep)
  if keep then
    return refill * RATE_PERIOD + period
  end
  return 0
end

-- Whether the cells are a state a bucket writes (Rust: within_reach):
-- a remainder below 2^53, and a recorded rate of 0 or a refill of 1 to
-- MAX_RECORDED_REFILL per a period of 1 µs to the longest window. Any
-- other is data Tollgate did not write (a zero period would divide by
-- zero).
local function token_bucket_understood(_, remainder, rate)
  if remainder >= MAX_EXACT then
    return false
  end
  if rate == 0 then
    return true
  end
  local refill = fdiv(rate, RATE_PERIOD)
  local period = rate - refill * RATE_PERIOD
  return refill >= 1 and refill <= MAX_RECORDED_REFILL and period >= 1 and period <= MAX_WINDOW_US
end

-- The units a bucket full again in `until_full` µs (with `remainder`) has
-- used at the rate `rate` records, rounded up; by whole periods first, so
-- every product stays below 2^53 (Rust: units_used).
local function token_bucket_used(until_full, remainder, rate)
  local refill = fdiv(rate, RATE_PERIOD)
  local period = rate - refill * RATE_PERIOD
  local whole = fdiv(until_full, period)
  local part = (until_full - whole * period) * refill
  if part >= remainder then
    return whole * refill + cdiv(part - remainder, period)
  end
  return max(whole * refill - fdiv(remainder - part, period), 0)
end

-- The state as a layer reads it at `now` (Rust: rebased): one that keeps
-- units reads a state written at another rate as the whole units it had
-- used (at most the capacity), and one that records no rate without its
-- remainder. nil: full.
local function token_bucket_rebased(capacity, refill, period, full_at, remainder, rate, now, keep)
  local own = token_bucket_rate(refill, period, keep)
  if not keep or not full_at or rate == own then
    return full_at, remainder, rate
  end
  if rate == 0 then
    return full_at, 0, 0
  end
  if full_at <= now then
    return nil, 0, 0
  end
  local deficit = min(token_bucket_used(full_at - now, remainder, rate), capacity) * period
  local until_full = cdiv(deficit, refill)
  return now + until_full, until_full * refill - deficit, own
end

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

local function token_bucket(capacity, refill, period, full_at, remainder, rate, now, cost, keep)
  -- A state of another rate (its plan changed) refills at that rate until
  -- a write moves it: a denial's waits are counted there (Rust:
  -- old_rate_waits).
  local old_at, old_remainder, old_rate = nil, 0, 0
  if keep and full_at and rate ~= 0 and rate ~= token_bucket_rate(refill, period, keep) and full_at > now then
    old_at, old_remainder, old_rate = full_at, remainder, rate
  end
  full_at, remainder = token_bucket_rebased(capacity, refill, period, full_at, remainder, rate, now, keep)
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
      cdiv(until_full, 1000), now + until_full, until_full * refill - deficit,
      token_bucket_rate(refill, period, keep)
  end
  local retry_after, reset_after = cdiv(need - level, refill), cdiv(full - level, refill)
  if old_at then
    -- u µs before full it has used ceil((u * R - r) / P) units at that rate.
    local old_refill = fdiv(old_rate, RATE_PERIOD)
    local old_period = old_rate - old_refill * RATE_PERIOD
    local room = max(capacity - cost, 0) * old_period + old_remainder
    retry_after = after(max(old_at - fdiv(room, old_refill), 0), now)
    reset_after = after(max(old_at - fdiv(old_remainder, old_refill), 0), now)
  elseif full_at and full_at > now then
    -- u µs before full the level is full + r - u * R (Rust:
    -- own_rate_waits), not capped at empty.
    local room = max(full + remainder - need, 0)
    retry_after = after(max(full_at - fdiv(room, refill), 0), now)
    reset_after = after(max(full_at - fdiv(remainder, refill), 0), now)
  end
  return false, capacity, fdiv(level, period), reset_after, retry_after
end

-- Token bucket: GCRA's refund in scaled tokens (Rust: token_bucket_refund).
-- The charge moved the instant the bucket is full again `cost × period`
-- scaled tokens later, to the mark it wrote (`mark_at`, with
-- `mark_remainder`); only what is still ahead of now is owed, and the
-- bucket never goes above full.
local function refund_token_bucket(capacity, refill, period, full_at, remainder, rate, now, cost, mark_remainder, mark_at, keep)
  if not full_at or mark_at <= now then
    return 0
  end
  full_at, remainder = token_bucket_rebased(capacity, refill, period, full_at, remainder, rate, now, keep)
  local own = token_bucket_rate(refill, period, keep)
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
    return give, now, 0, own
  end
  local until_full = cdiv(full - left, refill)
  return give, now + until_full, until_full * refill - (full - left), own
end

-- A reward: the refund of a charge that never ages.
local function reward_token_bucket(capacity, refill, period, a, b, c, now, units, keep)
  return refund_token_bucket(capacity, refill, period, a, b, c, now, units, 0, FAR, keep)
end

-- The charge an admitted state marks (refund's `at` and `mark`): the
-- remainder and the full-again instant it wrote.
local function charge_token_bucket(full_at, remainder, _)
  return remainder, full_at
end
