-- Tollgate: GCRA (Rust reference: algorithms/src/gcra.rs).
--
-- This file defines the algorithm (`gcra`), its refund (`refund_gcra`,
-- see layered.lua's refund mode), its reward (`reward_gcra`) and
-- the charge an admitted state marks (`charge_gcra`). The store runs them through
-- layered.lua, which holds the KEYS/ARGV layout (one layer = one call of
-- `gcra`) and finds them by the algorithm's code (src/script.rs
-- generates its tables from the Rust list of built-ins).
--
--   gcra(burst, interval_us, _, tat, rate, _, now, cost, keep)
--
-- Layer ARGV: algorithm 2 (+ KEEPS_UNITS: `keep`), cost, burst,
--   interval_us, 0.
-- State: the TAT in µs, stored as one integer (Redis keeps an integer
--   value inside the key's object: the smallest state), and when the layer
--   keeps units across a change of plan (`keep`) the interval it was
--   written at ("tat interval"); nil: none. No other time is kept: every
--   write leaves the TAT after its own time, so a clock that steps back
--   never refills twice (see the Rust reference).
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.

-- A TAT written at the interval `rate`, read by a layer that keeps units
-- at another one (Rust: rebased_tat): the whole units it stands for (a
-- partly recovered one counted as used; at most the burst), at the new
-- interval.
local function rebased_tat(burst, interval, tat, rate, now, keep)
  if not keep or not tat or rate == 0 or rate == interval or tat <= now then
    return tat
  end
  return now + min(cdiv(tat - now, rate), burst) * interval
end

-- Whether the cells' recorded interval is one GCRA writes: 0 or up to
-- the longest window (Rust: Gcra::is_recorded_rate). Any other is data
-- Tollgate did not write.
local function gcra_understood(_, rate, _)
  return rate <= MAX_WINDOW_US
end

local function gcra(burst, interval, _, tat, rate, _, now, cost, keep)
  -- A state of another interval (its plan changed) recovers at that
  -- interval until a write moves it: a denial's waits are counted there.
  local old_tat = nil
  if keep and tat and rate ~= 0 and rate ~= interval and tat > now then
    old_tat = tat
  end
  tat = rebased_tat(burst, interval, tat, rate, now, keep)
  local tolerance = burst * interval
  local t = now
  local base = t
  if tat and tat > t then
    base = tat
  end
  local new_tat = base + cost * interval
  -- new_tat is after now (cost and interval are at least 1), so the
  -- reset_after and the TTL need no after() or floor of 1 ms.
  local ahead = new_tat - t
  if ahead <= tolerance then
    return true, burst, fdiv(tolerance - ahead, interval), ahead, -1,
      cdiv(ahead, 1000), new_tat, keep and interval or 0, 0
  end
  -- Admitted once the effective time reaches new_tat - tolerance (base does
  -- not move before then). The max() guards states written under other
  -- parameters, or before the clock stepped back.
  local retry_at, reset_at = new_tat - tolerance, base
  if old_tat then
    -- Once the units used at that interval leave room for the cost. (The
    -- product is below old_tat - now in a denial: exact.)
    retry_at, reset_at = max(old_tat - max(burst - cost, 0) * rate, 0), old_tat
  end
  return false, burst, fdiv(max(tolerance - (base - t), 0), interval),
    after(reset_at, now), after(retry_at, now)
end

-- GCRA. The charge moved the TAT `cost × interval` later, to `tat_after`;
-- without it the TAT could have been raised to now since, so only what is
-- still ahead of now goes back, and the TAT never goes below now. A state
-- recreated since (the charged one expired) owes nothing without a check:
-- a GCRA state expires only after its TAT, so `tat_after` is not ahead.
local function refund_gcra(burst, interval, _, tat, rate, _, now, cost, at, tat_after, keep)
  if not tat then
    return 0
  end
  tat = rebased_tat(burst, interval, tat, rate, now, keep)
  local t = now
  local give = min(cost * interval, tat_after - t)
  if give <= 0 then
    return 0
  end
  local lowered = max(tat - give, t)
  if lowered >= tat then
    return 0
  end
  return tat - lowered, lowered, keep and interval or 0, 0
end

-- A reward: the refund of a charge that never ages.
local function reward_gcra(burst, interval, p3, a, b, c, now, units, keep)
  return refund_gcra(burst, interval, p3, a, b, c, now, units, 0, FAR, keep)
end

-- The charge an admitted state marks: the TAT it wrote.
local function charge_gcra(tat, _, _)
  return 0, tat
end
