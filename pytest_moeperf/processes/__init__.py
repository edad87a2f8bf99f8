"""Processes moeperf starts and stops: lifecycle of servers and rank groups, child pytest sessions, rounds."""
