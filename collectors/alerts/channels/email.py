"""Email through Django's mail framework (SMTP settings from the environment)."""

from __future__ import annotations

import smtplib

from django.conf import settings
from django.core.mail import EmailMessage

from collectors.alerts.channels import DeliveryError
from collectors.alerts.messages import AlertMessage
from collectors.alerts.models import Channel


def notify(channel: Channel, message: AlertMessage) -> None:
    if not channel.recipients:
        raise DeliveryError("the channel has no recipients", retryable=False)
    email = EmailMessage(subject=message.subject, body=message.text,
                         from_email=settings.DEFAULT_FROM_EMAIL, to=channel.recipients)
    try:
        email.send(fail_silently=False)
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused) as error:
        raise DeliveryError(f"SMTP refused: {error}", retryable=False) from error
    except (smtplib.SMTPException, OSError) as error:
        raise DeliveryError(f"SMTP: {error}") from error
